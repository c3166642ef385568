// SPDX-License-Identifier: Apache-2.0
#include "direct_source.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <fmt/format.h>
#include <string>
#include <vector>

#include "solar/storage/signals.h"

namespace solar::client {
namespace {

// The folder of the shared object this code is in (libsolar), with a trailing '/'; "" when
// it cannot be told. Absolute: dladdr gives the path as the loader was given it, relative
// when libsolar was opened by a relative path (SOLAR_LIBRARY=build/client/libsolar.so).
std::string find_own_folder() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&find_own_folder), &info) == 0 || !info.dli_fname)
    return {};
  char* real = ::realpath(info.dli_fname, nullptr);
  if (!real) return {};
  const std::string path = real;
  std::free(real);
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

// Resolved when libsolar is loaded, not at the first direct read: by then the program may have
// changed its working directory, against which a relative path would resolve.
const std::string kOwnFolder = find_own_folder();
std::string own_folder() { return kOwnFolder; }

struct DirectModule {
  DirectOpenFn* open = nullptr;
  std::string error;  // why it could not be loaded ("" = loaded)

  DirectModule() {
    // $SOLAR_DIRECT_LIBRARY replaces the search: a module named on purpose is the one used.
    std::string path;
    const char* env = std::getenv("SOLAR_DIRECT_LIBRARY");
    if (env && *env) {
      path = env;
    } else {
      const std::string folder = own_folder();
      if (folder.empty()) {
        error = fmt::format("cannot tell where libsolar is (dladdr) to find {} beside it; set "
                            "SOLAR_DIRECT_LIBRARY=/path/to/{}", kDirectModule, kDirectModule);
        return;
      }
      // Beside libsolar (the build tree, the wheel), else in its private folder solar/ (an
      // install: <libdir>/solar/, cmake/SolarInstall.cmake).
      path = folder + kDirectModule;
      const std::string installed = folder + "solar/" + kDirectModule;
      if (::access(path.c_str(), F_OK) != 0 && ::access(installed.c_str(), F_OK) == 0)
        path = installed;
    }
    void* h = nullptr;
    {
      // Loading libfabric runs its providers' libraries' constructors; libinfinipath's installs
      // handlers for SIGINT, SIGTERM, SIGSEGV, ... that exit(1). The rank's own dispositions
      // (Python's, a sanitizer's, the program's) are put back, whatever thread this is.
      const storage::signals::Snapshot before;
      h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      before.restore();
    }
    const char* how = env && *env ? "SOLAR_DIRECT_LIBRARY" : "beside libsolar";
    if (!h) {
      const char* why = ::dlerror();
      error = fmt::format(
          "reading the dataset directly (no agent) needs {}, which could not be loaded from {} "
          "({}): {}. Install it beside libsolar or in libsolar's folder solar/ (it is built "
          "and installed with it: the package libsolar0) or set SOLAR_DIRECT_LIBRARY to it",
          kDirectModule, path, how, why ? why : "unknown error");
      return;
    }
    open = reinterpret_cast<DirectOpenFn*>(::dlsym(h, kDirectOpenSymbol));
    if (!open)
      error = fmt::format("{} ({}) has no {}: it is not the direct-path module of this libsolar "
                          "({}); install both from one build",
                          path, how, kDirectOpenSymbol, SOLAR_VERSION_STRING);
  }
};

}  // namespace

std::unique_ptr<storage::SampleSource> open_direct_source(const std::string& spec,
                                                          const storage::SourceOptions& options) {
  static const DirectModule module;  // loaded once per process, never unloaded
  if (!module.open) throw storage::StorageError(module.error);
  storage::SampleSource* source = nullptr;
  char error[4096] = "";
  if (module.open(direct_build().c_str(), spec.c_str(), &options, &source, error,
                  sizeof error) != 0 || !source)
    throw storage::StorageError(error[0] ? error : "opening " + spec + " failed (no reason given)");
  return std::unique_ptr<storage::SampleSource>(source);
}

}  // namespace solar::client

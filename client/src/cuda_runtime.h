// SPDX-License-Identifier: Apache-2.0
// The CUDA runtime, opened on first use (SOLAR_WITH_CUDA builds): what solar_batch_to_device and
// the loader's pinned buffer use.
#pragma once

#ifdef SOLAR_WITH_CUDA
#include <dlfcn.h>

#include <cstdlib>
#include <fmt/format.h>
#include <string>
#include <type_traits>
#include <vector>

namespace solar::client {

// The CUDA runtime, opened on first use (dlopen): a rank without a GPU, or with its own CUDA
// (PyTorch's), loads nothing of ours. The few calls used are declared here, with the runtime
// API's values, so building needs no CUDA toolkit either. $SOLAR_CUDART names the library to
// use; otherwise one already loaded in the process (e.g. by PyTorch) or the system's.
struct Cuda {
  using Err = int;                               // cudaError_t; 0 = cudaSuccess
  static constexpr unsigned kRegisterPortable = 1, kRegisterReadOnly = 8;
  static constexpr int kHostToDevice = 1;        // cudaMemcpyHostToDevice
  Err (*GetDeviceCount)(int*) = nullptr;
  const char* (*GetErrorString)(Err) = nullptr;
  Err (*HostRegister)(void*, std::size_t, unsigned) = nullptr;
  Err (*HostUnregister)(void*) = nullptr;
  Err (*GetLastError)() = nullptr;
  Err (*MemcpyAsync)(void*, const void*, std::size_t, int, void*) = nullptr;
  std::string missing;  // why it could not be loaded ("" = loaded)

  Cuda() {
    std::vector<std::string> names;
    if (const char* e = std::getenv("SOLAR_CUDART"); e && *e) names.emplace_back(e);
    for (const char* n : {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                          "libcudart.so.11.0"})
      names.emplace_back(n);
    void* h = nullptr;
    for (const auto& n : names)  // one the process already has first
      if ((h = ::dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD))) break;
    for (std::size_t i = 0; !h && i < names.size(); ++i)
      h = ::dlopen(names[i].c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      missing = "the CUDA runtime (libcudart) is not installed or not on the library path "
                "(set SOLAR_CUDART to it)";
      return;
    }
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name));
      if (!fn && missing.empty()) missing = fmt::format("libcudart has no {}", name);
    };
    get(GetDeviceCount, "cudaGetDeviceCount");
    get(GetErrorString, "cudaGetErrorString");
    get(HostRegister, "cudaHostRegister");
    get(HostUnregister, "cudaHostUnregister");
    get(GetLastError, "cudaGetLastError");
    get(MemcpyAsync, "cudaMemcpyAsync");
  }
};

inline const Cuda& cuda() {
  static const Cuda c;
  return c;
}

}  // namespace solar::client
#endif

// SPDX-License-Identifier: Apache-2.0
#include "solar/storage/signals.h"

#include <dlfcn.h>

#include <cstring>
#include <string_view>

namespace solar::storage::signals {
namespace {

void* handler_of(const struct sigaction& a) {
  return (a.sa_flags & SA_SIGINFO) ? reinterpret_cast<void*>(a.sa_sigaction)
                                   : reinterpret_cast<void*>(a.sa_handler);
}

bool catchable(int sig) { return sig != SIGKILL && sig != SIGSTOP; }

bool installed_by_psm(const struct sigaction& a) {
  void* h = handler_of(a);
  if (h == reinterpret_cast<void*>(SIG_DFL) || h == reinterpret_cast<void*>(SIG_IGN)) return false;
  Dl_info info{};
  if (::dladdr(h, &info) == 0 || !info.dli_fname) return false;
  std::string_view name = info.dli_fname;
  if (const auto slash = name.rfind('/'); slash != std::string_view::npos)
    name = name.substr(slash + 1);
  return name.starts_with("libinfinipath") || name.starts_with("libpsm");
}

bool same(const struct sigaction& a, const struct sigaction& b) {
  return handler_of(a) == handler_of(b) && a.sa_flags == b.sa_flags &&
         std::memcmp(&a.sa_mask, &b.sa_mask, sizeof a.sa_mask) == 0;
}

// Before main (solar, solar-agent, solar-stored: this object is linked statically) or when
// libsolar is loaded (its dependencies' constructors, libinfinipath's among them, ran first).
[[gnu::constructor]] void reset_at_load() { reset_psm_handlers(); }

}  // namespace

int reset_psm_handlers() {
  int n = 0;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (!catchable(sig)) continue;
    struct sigaction cur {};
    if (::sigaction(sig, nullptr, &cur) != 0 || !installed_by_psm(cur)) continue;
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    if (::sigaction(sig, &dfl, nullptr) == 0) ++n;
  }
  return n;
}

Snapshot::Snapshot() {
  for (int sig = 0; sig < NSIG; ++sig) {
    std::memset(&act_[sig], 0, sizeof act_[sig]);
    ok_[sig] = sig > 0 && catchable(sig) && ::sigaction(sig, nullptr, &act_[sig]) == 0;
  }
}

void Snapshot::restore() const {
  for (int sig = 1; sig < NSIG; ++sig) {
    if (!ok_[sig]) continue;
    struct sigaction cur {};
    if (::sigaction(sig, nullptr, &cur) == 0 && !same(cur, act_[sig]))
      ::sigaction(sig, &act_[sig], nullptr);
  }
}

}  // namespace solar::storage::signals

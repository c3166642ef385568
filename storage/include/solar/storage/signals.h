// SPDX-License-Identifier: Apache-2.0
// What libraries do to a process's signal dispositions when they are loaded, undone.
//
// libfabric is built with its psm provider, which links libpsm_infinipath and libinfinipath.
// libinfinipath's constructor (run when the library is loaded, before main or inside dlopen)
// installs its own handlers for SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGILL and SIGABRT: they
// print a backtrace and exit(1). So Ctrl-C ended every program that links libfabric with status
// 1 instead of by the signal, a Python script that loads libsolar lost its KeyboardInterrupt,
// and a crash became an ordinary exit. (IPATH_NO_BACKTRACE=1 in the environment stops it, but
// only when set before the process starts.)
#pragma once

#include <signal.h>

namespace solar::storage::signals {

// Puts SIG_DFL back for every signal whose handler lives in libinfinipath or libpsm* (found
// with dladdr): only what those libraries installed, never a handler of the program's own, of
// Python, of faulthandler or of a sanitizer runtime. Returns how many signals were reset.
// Runs by itself when the storage library is loaded (a constructor in signals.cpp, after
// libinfinipath's: the dynamic linker runs a library's dependencies' constructors first), so
// solar, solar-agent, solar-stored and libsolar-direct.so (libsolar's direct path) start clean.
int reset_psm_handlers();

// Every standard and real-time signal's disposition at construction; restore() puts back the
// ones that differ now. Wrapped around the dlopen of libfabric (fabric.cpp), around libfabric
// calls that initialise its providers, and around libsolar's dlopen of libsolar-direct.so.
class Snapshot {
 public:
  Snapshot();
  void restore() const;

 private:
  struct sigaction act_[NSIG];
  bool ok_[NSIG];
};

}  // namespace solar::storage::signals

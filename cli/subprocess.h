// Transitional: child processes moved to sys/ (solar/sys/subprocess.h). This header goes once
// the launcher includes that one.
#pragma once

#include "solar/sys/subprocess.h"

namespace solar::cli {
using sys::current_environment;
using sys::exit_code_of;
using sys::spawn;
using sys::SpawnOptions;
using sys::wait_for;
}  // namespace solar::cli

// SPDX-License-Identifier: Apache-2.0
// solar_spank.so: the Slurm entry points. Each forwards to the module of the process it runs
// in (srun_side.cpp: srun, sbatch, salloc; stepd_side.cpp: a node's slurmstepd and slurmd's
// job epilog). No exception leaves this file.
#include <dlfcn.h>
#include <limits.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "state.h"

extern "C" {
// SPANK_PLUGIN's constants would get internal linkage in C++ (see shared notes).
extern const char plugin_name[];
extern const char plugin_type[];
extern const unsigned int plugin_version;
extern const unsigned int spank_plugin_version;
SPANK_PLUGIN(solar, 1)
}

namespace solar::spank {
namespace {

State g_state;
bool g_config_ok = false;

void error_line(const std::string& m) { slurm_error("solar: %s", m.c_str()); }

template <class F>
int guarded(const char* where, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    error_line(std::string(where) + ": " + e.what());
  } catch (...) {
    error_line(std::string(where) + ": unknown error");
  }
  return -1;
}

// A refusal on the submitting side (srun, sbatch, salloc) must stop the job whatever
// plugstack.conf says: with an `optional` line Slurm reports a failing plugin and goes on.
// Nothing is allocated or launched yet where this is called (option parsing, init_post_opt,
// srun's local_user_init before the launch), so the process exits after our one line.
int stop_if_refused(int rc) {
  if (rc == 0) return 0;
  const spank_context_t ctx = spank_context();
  if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR) {
    std::fflush(nullptr);
    std::exit(1);
  }
  return rc;
}

// One callback for the whole option table: `val` is the JobOptions field.
int on_option(int val, const char* optarg, int /*remote*/) {
  return stop_if_refused(guarded("option", [&] {
    try {
      g_state.options.set(val, optarg ? optarg : "");
    } catch (const ConfigError& e) {
      error_line(e.what());
      return -1;
    }
    return 0;
  }));
}

int load_config(int argc, char** argv);

// The plugin's own file as installed (symlinks resolved): the defaults of agent=, solar= and
// preload= lie relative to it. Empty if the loader cannot say.
std::string plugin_file() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&load_config), &info) == 0 || !info.dli_fname) return {};
  char real[PATH_MAX];
  return ::realpath(info.dli_fname, real) ? std::string(real) : std::string();
}

int load_config(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  try {
    g_state.config = PluginConfig::parse(args, plugin_file());
    g_config_ok = true;
    return 0;
  } catch (const ConfigError& e) {
    error_line(std::string("plugstack.conf: ") + e.what());
    return -1;
  }
}

}  // namespace

void error(const std::string& message) { error_line(message); }
void info(const std::string& message) { slurm_info("solar: %s", message.c_str()); }

}  // namespace solar::spank

using namespace solar::spank;

extern "C" {

int slurm_spank_init(spank_t sp, int argc, char** argv) {
  return guarded("init", [&] {
    if (load_config(argc, argv) != 0) return -1;
    const spank_context_t ctx = spank_context();
    if (ctx != S_CTX_LOCAL && ctx != S_CTX_REMOTE && ctx != S_CTX_ALLOCATOR) return 0;
    const auto& specs = option_specs();
    for (std::size_t i = 0; i < specs.size(); ++i) {
      std::string name = *specs[i].name ? std::string("solar-") + specs[i].name : "solar";
      spank_option opt{};
      opt.name = name.data();
      opt.arginfo = const_cast<char*>(specs[i].arginfo);
      opt.usage = const_cast<char*>(specs[i].usage);
      opt.has_arg = specs[i].arginfo ? 1 : 0;
      opt.val = static_cast<int>(i);
      opt.cb = on_option;
      if (const spank_err_t rc = spank_option_register(sp, &opt); rc != ESPANK_SUCCESS) {
        error_line("registering --" + name + ": " + spank_strerror(rc));
        return -1;
      }
    }
    return 0;
  });
}

int slurm_spank_init_post_opt(spank_t sp, int, char**) {
  return stop_if_refused(guarded("init_post_opt", [&] {
    switch (spank_context()) {
      case S_CTX_LOCAL:
      case S_CTX_ALLOCATOR: return validate_options(sp, g_state);
      default: return 0;
    }
  }));
}

int slurm_spank_local_user_init(spank_t sp, int, char**) {
  return stop_if_refused(guarded("local_user_init", [&] { return plan_step(sp, g_state); }));
}

int slurm_spank_user_init(spank_t sp, int, char**) {
  return guarded("user_init", [&] {
    return spank_context() == S_CTX_REMOTE ? start_node_agent(sp, g_state) : 0;
  });
}

int slurm_spank_task_init(spank_t sp, int, char**) {
  return guarded("task_init", [&] { return prepare_task(sp, g_state); });
}

int slurm_spank_task_exit(spank_t sp, int, char**) {
  return guarded("task_exit", [&] { return task_exited(sp, g_state); });
}

int slurm_spank_exit(spank_t sp, int, char**) {
  return guarded("exit", [&] {
    switch (spank_context()) {
      case S_CTX_LOCAL: return finish_step(sp, g_state);
      case S_CTX_REMOTE: return end_node_step(sp, g_state);
      default: return 0;
    }
  });
}

int slurm_spank_job_epilog(spank_t sp, int argc, char** argv) {
  return guarded("job_epilog", [&] {
    if (!g_config_ok && load_config(argc, argv) != 0) return -1;
    return sweep_job(sp, g_state);
  });
}

}  // extern "C"

// SPDX-License-Identifier: Apache-2.0
// solar: plan, inspect and run accelerated data loading for distributed training.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>

#include "commands.h"

int& solar::cli::exit_code() {
  static int code = solar::cli::kExitOk;
  return code;
}

namespace {

// Ctrl-C, kill, a closed terminal: say so on stderr and end by the signal itself, so the
// caller sees it (a shell's $? is 128+N, 130 for Ctrl-C) and a script running solar stops too.
// The dispositions libinfinipath's constructor had put there (exit 1, silently) are gone by now
// (storage/src/signals.h). `solar run` blocks these signals while its ranks run and forwards
// them (cli/launcher.cpp, sigtimedwait), so this handler only sees the ones that come before
// or after. A signal ignored when solar started (nohup, `&` in a script) stays ignored.
extern "C" void on_terminating_signal(int sig) {
  const char* text = sig == SIGINT    ? "solar: interrupted (SIGINT)\n"
                     : sig == SIGTERM ? "solar: terminated (SIGTERM)\n"
                                      : "solar: hung up (SIGHUP)\n";
  [[maybe_unused]] const ssize_t n = ::write(2, text, std::strlen(text));
  ::signal(sig, SIG_DFL);
  ::raise(sig);  // delivered when this handler returns: the process ends by the signal
}

void handle_terminating_signals() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction cur {};
    if (::sigaction(sig, nullptr, &cur) != 0 || cur.sa_handler == SIG_IGN) continue;
    struct sigaction act {};
    act.sa_handler = on_terminating_signal;
    sigemptyset(&act.sa_mask);
    ::sigaction(sig, &act, nullptr);
  }
}

}  // namespace

int main(int argc, char** argv) {
  handle_terminating_signals();
  CLI::App app{
      "solar: data loading for distributed deep-learning training.\n"
      "The whole shuffled access order of a run is known before it starts; solar plans it\n"
      "(which rank reads which sample, what each node keeps in memory) and executes it.",
      "solar"};
  app.require_subcommand(1);
  app.allow_extras(false);
  app.set_version_flag("--version", "solar " SOLAR_PROJECT_VERSION);
  solar::cli::add_plan_commands(app);
  solar::cli::add_report_command(app);
  solar::cli::add_slurm_check_command(app);
#ifdef SOLAR_HAVE_STORAGE
  solar::cli::add_storage_commands(app);
  solar::cli::add_run_commands(app);
  solar::cli::add_stat_command(app);
  solar::cli::add_bench_loader_command(app);
  solar::cli::add_bench_serve_command(app);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // `solar frobnicate`: say that the command is unknown and which ones exist, rather than
    // CLI11's "A subcommand is required".
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
      known = known || (argc > 1 && sub->get_name() == argv[1]);
    }
    if (argc > 1 && argv[1][0] != '-' && !known) {
      std::fprintf(stderr, "solar: unknown command '%s'; the commands are: %s\n"
                           "Run `solar --help` or `solar <command> --help`.\n",
                   argv[1], names.c_str());
      return solar::cli::kExitUsage;
    }
    std::fprintf(stderr, "solar: %s\nRun `solar --help` or `solar <command> --help`.\n",
                 e.what());
    return solar::cli::kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solar: %s\n", e.what());
    return solar::cli::kExitFailure;
  }
  return solar::cli::exit_code();
}

// solar: plan, inspect and run accelerated data loading for distributed training.
#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "commands.h"

int& solar::cli::exit_code() {
  static int code = solar::cli::kExitOk;
  return code;
}

int main(int argc, char** argv) {
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
#ifdef SOLAR_HAVE_STORAGE
  solar::cli::add_storage_commands(app);
  solar::cli::add_run_commands(app);
  solar::cli::add_bench_loader_command(app);
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

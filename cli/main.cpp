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
  app.set_version_flag("--version", "solar 0.1.0");
  solar::cli::add_plan_commands(app);
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
    std::fprintf(stderr, "solar: %s\nRun `solar --help` or `solar <command> --help`.\n",
                 e.what());
    return solar::cli::kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solar: %s\n", e.what());
    return solar::cli::kExitFailure;
  }
  return solar::cli::exit_code();
}

// SPDX-License-Identifier: Apache-2.0
// Prints the --solar-* options of solar_spank.so from the plugin's own option table
// (settings.h: option_specs), one line each: FLAG, ARG ("" for a flag), ENV and USAGE, separated
// by tabs. packaging/man/make_page.py turns them into the OPTIONS section of solar_spank(8)
// (cmake/SolarInstall.cmake). Not installed: a build tool, so the page never drifts from what
// `srun --help` shows.
#include <cstdio>
#include <string>

#include "settings.h"

int main() {
  for (const auto& spec : solar::spank::option_specs()) {
    const std::string flag = *spec.name ? std::string("--solar-") + spec.name : "--solar";
    std::string usage = spec.usage;
    if (usage.rfind("solar: ", 0) == 0) usage.erase(0, 7);
    std::printf("%s\t%s\t%s\t%s\n", flag.c_str(), spec.arginfo ? spec.arginfo : "", spec.env,
                usage.c_str());
  }
  return 0;
}

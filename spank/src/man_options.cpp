// SPDX-License-Identifier: Apache-2.0
// Prints the --solar-* options of solar_spank.so as roff (.TP paragraphs) from the plugin's own
// option table (settings.h: option_specs), for the OPTIONS section of solar_spank(8)
// (packaging/man/solar_spank.8, cmake/SolarInstall.cmake). Not installed: a build tool, so the
// page never drifts from what `srun --help` shows.
#include <cstdio>
#include <string>

#include "settings.h"

namespace {

// roff text: backslashes and hyphens escaped, a leading '.' or '\'' protected.
std::string roff(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') out += "\\e";
    else if (c == '-') out += "\\-";
    else out += c;
  }
  if (!out.empty() && (out[0] == '.' || out[0] == '\'')) out.insert(0, "\\&");
  return out;
}

}  // namespace

int main() {
  for (const auto& spec : solar::spank::option_specs()) {
    const std::string name = *spec.name ? std::string("--solar-") + spec.name : "--solar";
    std::string usage = spec.usage;
    if (usage.rfind("solar: ", 0) == 0) usage.erase(0, 7);
    std::printf(".TP\n\\fB%s\\fR", roff(name).c_str());
    if (spec.arginfo) {
      // A break point (\:) after each '|': the long alternatives may wrap.
      std::string arg = roff(spec.arginfo);
      for (std::size_t at = 0; (at = arg.find('|', at)) != std::string::npos; at += 3)
        arg.insert(at + 1, "\\:");
      std::printf("=\\fI%s\\fR", arg.c_str());
    }
    std::printf("\n%s.\n.br\nEnvironment: \\fB%s\\fR.\n", roff(usage).c_str(), roff(spec.env).c_str());
  }
  return 0;
}

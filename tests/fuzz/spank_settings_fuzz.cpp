// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the SPANK plugin's settings (spank/src/settings.h). The input's lines are,
// in turn: the plugin's own path, plugstack.conf's arguments (split at blanks, as Slurm does),
// then --solar-* options and SOLAR_* variables as `NAME=VALUE` lines (NAME an option's name
// for a command-line option, a variable's name for the environment), and finally the JSON line
// `solar dataset-info` answers. Everything the plugin does with them before a plan is computed
// runs: every refusal must be a ConfigError naming the setting (anything else escaping is a
// finding), and nothing may crash.
#include <cstddef>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "settings.h"

using solar::ConfigError;
using solar::spank::DatasetShape;
using solar::spank::JobOptions;
using solar::spank::PluginConfig;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::string plugin_path, line;
  std::getline(in, plugin_path);
  std::getline(in, line);
  std::vector<std::string> args;
  {
    std::istringstream words(line);
    for (std::string w; words >> w;) args.push_back(w);
  }
  PluginConfig pc;
  try {
    pc = PluginConfig::parse(args, plugin_path);
  } catch (const ConfigError&) {
  }

  JobOptions o;
  std::map<std::string, std::string> env;
  std::string dataset_line;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '{') {
      dataset_line = line;
      break;
    }
    const auto eq = line.find('=');
    const std::string name = line.substr(0, eq);
    const std::string value = eq == std::string::npos ? std::string() : line.substr(eq + 1);
    const auto& specs = solar::spank::option_specs();
    for (int f = 0; f < JobOptions::kFields; ++f) {
      if (name == specs[f].env) env[name] = value;
      if (name == specs[f].name) {
        try {
          o.set(f, value);
        } catch (const ConfigError&) {
        }
      }
    }
  }
  try {
    o.add_environment([&](const char* n) -> const char* {
      const auto it = env.find(n);
      return it == env.end() ? nullptr : it->second.c_str();
    });
  } catch (const ConfigError&) {
  }
  (void)o.active();
  (void)o.is_verbose();
  (void)o.stats_path();
  DatasetShape shape{1000, 4096, 0, 4, "fuzz"};
  if (!dataset_line.empty()) {
    try {
      shape = DatasetShape::parse(dataset_line);
    } catch (const ConfigError&) {
    }
  }
  try {
    o.validate();
    (void)o.partial_config();
    (void)o.buffer_spec();
    std::string notes;
    const std::uint32_t nodes = 1 + size % 7, ranks = 1 + size % 5;
    (void)solar::spank::plan_config_for_step(o, pc, shape, nodes, ranks,
                                             std::uint64_t{64} << 30, &notes);
  } catch (const ConfigError&) {
  }
  return 0;
}

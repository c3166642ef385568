// SPDX-License-Identifier: Apache-2.0
// The command line of the sized-sample bench tools (solar-eviction-variants,
// solar-extent-fragmentation): a plan config of samples whose sizes are spread evenly over
// 1 MiB ± --spread percent (drawn from --seed), the buffer --buffer percent of their bytes.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "solar/core/config.h"
#include "solar/core/rng.h"

namespace solar::bench {

struct SizedInstance {
  PlanConfig config;
  std::uint64_t spread = 50, buffer_percent = 40;
};

// Parses the options (--nodes and --policy only where `several_nodes`) and builds the config;
// prints the error or --help and returns nothing when the tool should exit with `exit_code`.
inline std::optional<SizedInstance> sized_instance(int argc, char** argv, const std::string& about,
                                                   bool several_nodes, int& exit_code) {
  CLI::App app(about);
  SizedInstance s;
  PlanConfig& c = s.config;
  c.samples = 2000;
  c.epochs = 5;
  c.ranks_per_node = 4;
  c.batch = 8;
  std::string policy = "sampler";
  app.add_option("--samples", c.samples, "Samples [2000]")->check(CLI::Range(1, 1 << 24));
  app.add_option("--epochs", c.epochs, "Epochs [5]")->check(CLI::Range(1, 1000));
  app.add_option("--ranks", c.ranks_per_node, "Ranks per node [4]")->check(CLI::Range(1, 1024));
  app.add_option("--batch", c.batch, "Per-rank batch [8]")->check(CLI::Range(1, 65536));
  app.add_option("--spread", s.spread, "Sizes spread over 1 MiB ± this percent [50]")
      ->check(CLI::Range(0, 99));
  app.add_option("--buffer", s.buffer_percent, "Buffer per node, percent of the bytes [40]")
      ->check(CLI::Range(1, 100));
  app.add_option("--seed", c.seed, "Seed of the order and the sizes [0]");
  if (several_nodes) {
    app.add_option("--nodes", c.nodes, "Nodes [1]")->check(CLI::Range(1, 4096));
    app.add_option("--policy", policy, "solar, sampler, lru or none [sampler]");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    exit_code = app.exit(e);
    return std::nullopt;
  }
  const auto p = parse_policy(policy);
  if (!p) {
    std::fprintf(stderr, "--policy: '%s' is not a policy (solar, sampler, lru, none)\n",
                 policy.c_str());
    exit_code = 2;
    return std::nullopt;
  }
  c.policy = *p;
  const std::uint64_t mean = 1 << 20, lo = mean - mean * s.spread / 100,
                      hi = mean + mean * s.spread / 100;
  Xoshiro256 g(c.seed + 1);
  auto sizes = std::make_shared<std::vector<std::uint64_t>>(c.samples);
  std::uint64_t total = 0;
  for (auto& v : *sizes) total += v = lo + g.bounded(hi - lo + 1);
  c.sample_sizes = sizes;
  c.sample_bytes = total / c.samples;
  c.buffer_bytes = total * s.buffer_percent / 100;
  try {
    c.validate();
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    exit_code = 2;
    return std::nullopt;
  }
  return s;
}

}  // namespace solar::bench

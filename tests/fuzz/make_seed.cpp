// SPDX-License-Identifier: Apache-2.0
// Writes a small valid plan file: the fuzzer's seed corpus (mutations of a real file reach
// far deeper than random bytes). With --sized, one of samples of differing sizes.
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "solar/core/plan_file.h"
#include "solar/core/planner.h"

int main(int argc, char** argv) {
  const bool sized = argc == 3 && std::strcmp(argv[2], "--sized") == 0;
  if (argc != 2 && !sized) {
    std::fprintf(stderr, "usage: %s OUT [--sized]\n", argv[0]);
    return 2;
  }
  solar::PlanConfig c;
  c.samples = 40;
  c.sample_bytes = 8;
  c.epochs = 2;
  c.nodes = 2;
  c.ranks_per_node = 2;
  c.batch = 2;
  c.imbalance = 1;
  c.buffer_bytes = 12 * 8;
  if (sized) {
    auto v = std::make_shared<std::vector<std::uint64_t>>(c.samples);
    for (std::uint64_t i = 0; i < c.samples; ++i) (*v)[i] = 4 + i % 9;  // 4..12 bytes
    c.sample_sizes = v;
  }
  solar::write_plan_file(solar::make_plan(c), argv[1]);
  return 0;
}

// Writes a small valid plan file: the fuzzer's seed corpus (mutations of a real file reach
// far deeper than random bytes).
#include <cstdio>

#include "solar/core/plan_file.h"
#include "solar/core/planner.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT\n", argv[0]);
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
  solar::write_plan_file(solar::make_plan(c), argv[1]);
  return 0;
}

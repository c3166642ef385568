// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the plan-file reader must reject any byte string cleanly (PlanFileError)
// or decode it into a plan; never crash, hang or read out of bounds (built with ASan/UBSan).
#include <cstddef>
#include <cstdint>

#include "solar/core/plan_file.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const solar::Plan plan = solar::decode_plan(data, size, "fuzz");
    (void)plan;
  } catch (const solar::PlanFileError&) {
  }
  return 0;
}

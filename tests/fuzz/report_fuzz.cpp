// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: `solar report`'s reading of its JSON inputs and the picture drawn from them
// (cli/report.h). Any text must give a picture or one BadInput naming the file; nothing else may
// escape, crash or hang (the run uses -timeout).
#include <cstddef>
#include <cstdint>
#include <string>

#include "report.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)solar::cli::report_svg({{"fuzz.json", text}}, "fuzz");
  } catch (const solar::cli::BadInput&) {
  }
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
#include "environment.h"

#include <cerrno>
#include <cstdlib>
#include <fmt/format.h>

namespace solar::client {

std::string env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  if (v) return v;
  if (fallback) return fallback;
  throw ClientError(fmt::format("{} is not set: run under `solar run` or `srun --solar-*`, or set "
                                "it (see solar.h)",
                                name));
}

std::optional<std::uint32_t> env_u32(const char* name, const char* alt) {
  const char* v = std::getenv(name);
  const char* shown = name;
  if (!v && alt) {
    v = std::getenv(alt);
    shown = alt;
  }
  if (!v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const unsigned long x = std::strtoul(v, &end, 10);
  if (errno || end == v || *end || *v == '-' || x > 0xffffffffUL)
    throw ClientError(fmt::format("{}='{}' is not a non-negative integer", shown, v));
  return static_cast<std::uint32_t>(x);
}

std::string multi_process_launch() {
  for (const char* name : {"WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE",
                           "PMI_SIZE"}) {
    const char* v = std::getenv(name);
    if (v && std::strtoul(v, nullptr, 10) > 1) return fmt::format("{}={}", name, v);
  }
  return {};
}

double agent_timeout_from_env() {
  const char* v = std::getenv("SOLAR_AGENT_TIMEOUT");
  if (!v || !*v) return kDefaultAgentTimeout;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v, &end);
  if (errno || end == v || *end || !(x >= 0) || x > 1e9)
    throw ClientError(fmt::format("SOLAR_AGENT_TIMEOUT='{}' is not a number of seconds (the "
                                  "longest wait for the node agent; 0 for no limit)",
                                  v));
  return x;
}

}  // namespace solar::client

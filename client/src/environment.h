// SPDX-License-Identifier: Apache-2.0
// What libsolar reads from its environment (solar.h lists the variables): the launcher's
// SOLAR_* and rank variables, SOLAR_AGENT_TIMEOUT; ClientError, what a bad one throws.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace solar::client {

class ClientError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// $name, else `fallback`; neither: ClientError saying how to run.
std::string env(const char* name, const char* fallback = nullptr);

// A whole number from the environment; nullopt when neither `name` nor `alt` is set.
std::optional<std::uint32_t> env_u32(const char* name, const char* alt = nullptr);

// The launcher variable that says this process is one of several, if any ("WORLD_SIZE=4").
std::string multi_process_launch();

// SOLAR_AGENT_TIMEOUT: how long a rank waits for any reply of its agent (seconds; 0: no limit).
constexpr double kDefaultAgentTimeout = 60;
double agent_timeout_from_env();

}  // namespace solar::client

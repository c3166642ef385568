// An agent's statistics as lines for people: `solar run`'s summary and `solar stat`.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace solar::cli {

// An agent's transparent-mode counters for people: reads served and fallen through, and
// whether the script followed the plan (`solar run`'s summary and `solar stat`).
std::string transparent_line(const nlohmann::json& t, std::uint64_t total_steps);

// When an agent's unmodified ranks read more than 2% of their reads from the file: says so,
// and whether the agent was behind them (its per-epoch lead figures), else "".
std::string fell_through_line(const nlohmann::json& a, const nlohmann::json& t);

// "; X from the device" when the agent's kernel counted its block reads (device_read_bytes).
std::string device_bytes(const nlohmann::json& a);

// An agent's peer-sharing counters for people (`solar run`'s summary and `solar stat`).
std::string peers_line(const nlohmann::json& p);

}  // namespace solar::cli

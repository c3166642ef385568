// SPDX-License-Identifier: Apache-2.0
#include "run_stats.h"

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <stdexcept>

#include "solar/stats_file.h"
#include "solar/sys/atomic_file.h"

namespace solar::cli {
namespace fs = std::filesystem;

nlohmann::json run_stats_document(const fs::path& dir, std::uint32_t nodes, bool agents,
                                  const nlohmann::json& plan) {
  nlohmann::json list = nlohmann::json::array();
  for (std::uint32_t m = 0; m < nodes; ++m) {
    std::ifstream f(dir / fmt::format("node{}.stats.json", m));
    nlohmann::json n;
    if (!agents) {
      n = protocol::missing_node_record(m, "no agent (--no-agent): ranks read directly");
    } else if (!f) {
      n = protocol::missing_node_record(
          m, "the agent wrote no statistics (it failed or was killed)");
    } else {
      try {
        n = nlohmann::json::parse(f);
      } catch (const std::exception& e) {
        n = protocol::missing_node_record(m, fmt::format("unreadable statistics: {}", e.what()));
      }
    }
    list.push_back(std::move(n));
  }
  return protocol::run_stats_file("solar run", std::move(list),
                                  plan.is_null() ? nlohmann::json::object()
                                                 : nlohmann::json{{"plan", plan}});
}

void write_run_stats(const std::string& out, const fs::path& dir, std::uint32_t nodes,
                     bool agents, const nlohmann::json& plan) {
  const nlohmann::json doc = run_stats_document(dir, nodes, agents, plan);
  if (const char* failed = sys::write_file_atomically(out, protocol::stats_file_text(doc), 0666))
    throw std::runtime_error(
        fmt::format("--stats-out {}: {}: {}", out, failed, std::strerror(errno)));
}

}  // namespace solar::cli

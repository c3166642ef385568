// SPDX-License-Identifier: Apache-2.0
#include "solar/core/config.h"

#include <algorithm>
#include <cerrno>
#include <functional>
#include <cmath>
#include <cstdlib>
#include <fmt/format.h>

#include "solar/sys/output_path.h"

namespace solar {

std::string_view to_string(OrderMode m) {
  return m == OrderMode::torch ? "torch" : m == OrderMode::file ? "file" : "solar";
}

std::string_view to_string(Policy p) {
  switch (p) {
    case Policy::none: return "none";
    case Policy::lru: return "lru";
    case Policy::solar_paper: return "solar-paper";
    case Policy::nopfs: return "nopfs";
    case Policy::solar: return "solar";
    case Policy::sampler: return "sampler";
  }
  return "?";
}

std::optional<OrderMode> parse_order_mode(std::string_view s) {
  if (s == "solar") return OrderMode::solar;
  if (s == "torch") return OrderMode::torch;
  return std::nullopt;
}

std::optional<Policy> parse_policy(std::string_view s) {
  for (Policy p : all_policies())
    if (to_string(p) == s) return p;
  return std::nullopt;
}

const std::vector<Policy>& all_policies() {
  static const std::vector<Policy> v{Policy::none, Policy::lru, Policy::solar_paper,
                                     Policy::nopfs, Policy::solar, Policy::sampler};
  return v;
}

void PlanConfig::validate() const {
  auto range = [](const char* flag, std::uint64_t v, std::uint64_t lo, std::uint64_t hi,
                  const char* what) {
    if (v < lo || v > hi)
      throw ConfigError(flag, fmt::format("{} is {}; allowed range is {}..{}", what, v, lo, hi));
  };
  range("--samples", samples, 1, kMaxSamples, "sample count");
  range("--sample-bytes", sample_bytes, 1, kMaxSampleBytes, "sample size");
  range("--epochs", epochs, 1, kMaxEpochs, "epoch count");
  range("--nodes", nodes, 1, kMaxNodes, "node count");
  range("--ranks-per-node", ranks_per_node, 1, kMaxRanksPerNode, "ranks per node");
  if (world() > samples)
    throw ConfigError("--ranks-per-node",
                      fmt::format("{} nodes × {} ranks = {} ranks exceed the {} samples; allowed "
                                  "total ranks is 1..{}",
                                  nodes, ranks_per_node, world(), samples, samples));
  const std::uint64_t max_batch = samples / world();
  if (batch < 1 || batch > max_batch)
    throw ConfigError("--batch", fmt::format("{} per rank × {} ranks = {} exceeds the dataset's {} "
                                             "samples; allowed range is 1..{}",
                                             batch, world(), std::uint64_t{batch} * world(),
                                             samples, max_batch));
  if (imbalance >= batch)
    throw ConfigError("--imbalance", fmt::format("δ is {}; allowed range is 0..{} (each rank "
                                                 "must get at least one sample: b-δ ≥ 1)",
                                                 imbalance, batch - 1));
  // Accesses per epoch: DistributedSampler pads the samples to a multiple of the world size
  // (unless drop_last). Every access time must fit a 32-bit eviction key (node_buffer.h).
  const std::uint64_t per_epoch =
      drop_last ? samples : (samples + world() - 1) / world() * world();
  if (std::uint64_t{epochs} * per_epoch > kMaxAccesses) {
    const std::string what =
        per_epoch == samples
            ? fmt::format("{} samples", samples)
            : fmt::format("{} accesses per epoch ({} samples padded to a multiple of {} ranks)",
                          per_epoch, samples, world());
    throw ConfigError("--epochs", fmt::format("{} epochs × {} = {} accesses exceed the plan "
                                              "limit of {}; allowed epochs is 1..{}",
                                              epochs, what, std::uint64_t{epochs} * per_epoch,
                                              kMaxAccesses, kMaxAccesses / per_epoch));
  }
  if (order_list && order != OrderMode::file)
    throw ConfigError("--order", "an order list is given but the order is not `file`");
  if (order_list && order_list->size() != std::uint64_t{epochs} * samples)
    throw ConfigError("--order-file",
                      fmt::format("the order holds {} sample ids; {} epochs × {} samples need {}",
                                  order_list->size(), epochs, samples,
                                  std::uint64_t{epochs} * samples));
  if (local_bytes > 0) {
    if (sized())
      throw ConfigError("--local-buffer", "samples of differing sizes are not planned on a local "
                                          "tier yet; drop --local-buffer or plan samples of one "
                                          "size");
    if (peer_fetch)
      throw ConfigError("--local-buffer", "peers reading from a node's local tier are not "
                                          "planned yet; drop --peer-fetch or --local-buffer");
    if (policy == Policy::none)
      throw ConfigError("--local-buffer", "policy none keeps no buffer to put a tier below; "
                                          "choose another --policy");
    if (local_bytes > kMaxDatasetBytes)
      throw ConfigError("--local-buffer", fmt::format("{} per node; allowed is at most {}",
                                                      format_bytes(local_bytes),
                                                      format_bytes(kMaxDatasetBytes)));
    if (local_samples() == 0)
      throw ConfigError("--local-buffer",
                        fmt::format("{} per node is smaller than one sample ({})",
                                    format_bytes(local_bytes), format_bytes(sample_bytes)));
  }
  if (sized()) {
    validate_sizes();
    return;
  }
  if (policy != Policy::none) {
    const std::uint64_t need = std::uint64_t{ranks_per_node} * (batch + imbalance);
    if (buffer_bytes < sample_bytes)
      throw ConfigError("--buffer", fmt::format("{} per node is smaller than one sample ({}); "
                                                "allowed is at least {} (one step of a node's "
                                                "ranks: {} samples)",
                                                format_bytes(buffer_bytes),
                                                format_bytes(sample_bytes),
                                                format_bytes(need * sample_bytes), need));
    if (buffer_samples() < need)
      throw ConfigError("--buffer",
                        fmt::format("{} per node holds {} samples but one step of a node's {} "
                                    "ranks needs {} (R·(b+δ)); allowed is at least {}",
                                    format_bytes(buffer_bytes), buffer_samples(), ranks_per_node,
                                    need, format_bytes(need * sample_bytes)));
  }
}

// The rules of a config with sized samples (after the common ones): one size per sample, each
// in range, the dataset's bytes countable; the policies and options that plan them; a buffer
// that holds the largest sample and one step of the node's ranks at its largest.
void PlanConfig::validate_sizes() const {
  const std::vector<std::uint64_t>& s = *sample_sizes;
  if (s.size() != samples)
    throw ConfigError("--sample-sizes", fmt::format("{} sizes for {} samples; give one size per "
                                                    "sample",
                                                    s.size(), samples));
  std::uint64_t largest = 0, at = 0, total = 0;
  for (std::uint64_t x = 0; x < samples; ++x) {
    if (s[x] < 1 || s[x] > kMaxSampleBytes)
      throw ConfigError("--sample-sizes", fmt::format("sample {} is {} bytes; allowed range is "
                                                      "1..{}",
                                                      x, s[x], kMaxSampleBytes));
    if (s[x] > largest) {
      largest = s[x];
      at = x;
    }
    total += s[x];  // each ≤ 2^40, the sum checked at every step: it cannot wrap
    if (total > kMaxDatasetBytes)
      throw ConfigError("--sample-sizes", fmt::format("the samples add up to more than {} bytes",
                                                      kMaxDatasetBytes));
  }
  if (policy == Policy::nopfs || policy == Policy::solar_paper)
    throw ConfigError("--policy", fmt::format("{} plans samples of one size; samples of "
                                              "differing sizes are planned by solar, sampler, "
                                              "lru and none",
                                              to_string(policy)));
  if (peer_fetch)
    throw ConfigError("--peer-fetch", "reads from peers are planned for samples of one size "
                                      "only; plan samples of differing sizes without it");
  if (policy == Policy::none) return;
  if (buffer_bytes < largest)
    throw ConfigError("--buffer", fmt::format("{} per node is smaller than the largest sample "
                                              "(sample {}, {}); allowed is at least {} (one "
                                              "step of a node's ranks at their largest)",
                                              format_bytes(buffer_bytes), at,
                                              format_bytes(largest),
                                              format_bytes(step_bytes_at_most())));
  if (const std::uint64_t need = step_bytes_at_most(); buffer_bytes < need)
    throw ConfigError("--buffer",
                      fmt::format("{} per node cannot hold one step of a node's {} ranks at "
                                  "their largest: the {} largest samples (R·(b+δ)) are {}; "
                                  "allowed is at least {}",
                                  format_bytes(buffer_bytes), ranks_per_node,
                                  std::uint64_t{ranks_per_node} * (batch + imbalance),
                                  format_bytes(need), format_bytes(need)));
}

std::uint64_t PlanConfig::step_bytes_at_most() const {
  if (!sized()) return std::uint64_t{ranks_per_node} * (batch + imbalance) * sample_bytes;
  std::vector<std::uint64_t> s = *sample_sizes;
  const std::size_t k = std::min<std::size_t>(
      s.size(), std::size_t{ranks_per_node} * (std::size_t{batch} + imbalance));
  std::nth_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k), s.end(),
                   std::greater<>{});
  std::uint64_t b = 0;
  for (std::size_t i = 0; i < k; ++i) b += s[i];
  return b;
}

std::uint64_t PlanConfig::dataset_bytes() const {
  if (!sized()) return samples * sample_bytes;
  std::uint64_t b = 0;
  for (std::uint64_t v : *sample_sizes) b += v;
  return b;
}

std::uint64_t parse_count(std::string_view text, const std::string& flag, std::uint64_t lo,
                          std::uint64_t hi) {
  auto bad = [&](const char* why) {
    return ConfigError(flag, fmt::format("'{}' {}; allowed range is {}..{}", text, why, lo, hi));
  };
  if (text.empty()) throw bad("is empty");
  if (text.front() == '-') throw bad("is negative");
  std::uint64_t v = 0;
  for (char ch : text) {
    if (ch < '0' || ch > '9') throw bad("is not a whole number");
    const auto d = static_cast<std::uint64_t>(ch - '0');
    if (v > (~std::uint64_t{0} - d) / 10) throw bad("is out of range");
    v = v * 10 + d;
  }
  if (v < lo || v > hi) throw bad("is out of range");
  return v;
}

std::uint64_t parse_bytes(std::string_view text, const std::string& flag) {
  std::string s(text);
  auto bad = [&](const std::string& why) {
    return ConfigError(flag, fmt::format("'{}' {}; use a byte count with an optional K, M, G or "
                                         "T suffix (binary multiples), e.g. 512M",
                                         s, why));
  };
  if (s.empty()) throw bad("is empty");
  if (s.find('-') != std::string::npos) throw bad("is negative");
  errno = 0;
  char* end = nullptr;
  const long double v = std::strtold(s.c_str(), &end);
  if (end == s.c_str() || errno == ERANGE || !std::isfinite(static_cast<double>(v)))
    throw bad("is not a size");
  std::string suffix(end);
  if (!suffix.empty() && (suffix.back() == 'B' || suffix.back() == 'b')) suffix.pop_back();
  if (suffix.size() == 2 && (suffix[1] == 'i')) suffix.pop_back();
  long double mult = 1;
  if (suffix.empty()) mult = 1;
  else if (suffix == "K" || suffix == "k") mult = 1024.0L;
  else if (suffix == "M" || suffix == "m") mult = 1024.0L * 1024;
  else if (suffix == "G" || suffix == "g") mult = 1024.0L * 1024 * 1024;
  else if (suffix == "T" || suffix == "t") mult = 1024.0L * 1024 * 1024 * 1024;
  else throw bad("has an unknown suffix '" + std::string(end) + "'");
  const long double bytes = v * mult;
  if (bytes >= 18446744073709551615.0L) throw bad("overflows 64 bits");
  return static_cast<std::uint64_t>(bytes);
}

BufferSpec BufferSpec::parse(std::string_view text, const std::string& flag) {
  BufferSpec spec;
  if (!text.empty() && text.back() == '%') {
    std::string s(text.substr(0, text.size() - 1));
    char* end = nullptr;
    errno = 0;
    const double p = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE || !(p > 0) || p > 100)
      throw ConfigError(flag, fmt::format("'{}' is not a percentage; allowed is (0, 100]%, "
                                          "e.g. 22.5%",
                                          text));
    spec.percent = p;
    return spec;
  }
  spec.bytes = parse_bytes(text, flag);
  return spec;
}

std::uint64_t BufferSpec::resolve(std::uint64_t samples, std::uint64_t sample_bytes) const {
  if (percent < 0) return bytes;
  // Exact for the presets: 22.5% of 8192 = 1843.2 -> 1843 samples.
  const auto n = static_cast<std::uint64_t>(std::floor(percent * static_cast<double>(samples) /
                                                       100.0 + 1e-9));
  return n * sample_bytes;
}

std::uint64_t agent_sample_slot_bytes(std::uint64_t sample_bytes) {
  return (sample_bytes + 63) / 64 * 64;
}

std::uint64_t agent_slot_bytes(std::uint64_t sample_bytes, std::uint64_t label_bytes) {
  return agent_sample_slot_bytes(sample_bytes) + label_bytes;
}

void fit_plan_to_agent_budget(PlanConfig& c, std::uint64_t budget_bytes,
                              std::uint64_t label_bytes, std::uint32_t staging_steps) {
  const std::uint64_t slot = agent_slot_bytes(c.sample_bytes, label_bytes);
  const std::uint64_t step = std::uint64_t{c.ranks_per_node} * (c.batch + c.imbalance);
  const std::uint64_t slots = budget_bytes / slot;
  const std::uint64_t need = step * (staging_steps + 1);
  if (slots < need)
    throw ConfigError("--buffer", fmt::format("{} per node holds {} samples of {} (with labels); "
                                              "the agent needs at least {} ({} steps of {} "
                                              "ranks); allowed is at least {}",
                                              format_bytes(budget_bytes), slots,
                                              format_bytes(slot), need, staging_steps + 1,
                                              c.ranks_per_node, format_bytes(need * slot)));
  c.buffer_bytes = (slots - step * staging_steps) * c.sample_bytes;
}

void follow_the_script(PlanConfig& c, bool order_given) {
  if (order_given && c.order != OrderMode::torch && c.order != OrderMode::file)
    throw ConfigError("--order", "an unmodified script reads in DistributedSampler's order: use "
                                 "torch (the default in the transparent mode), or give the "
                                 "script's own order with --order-file");
  if (c.imbalance)
    throw ConfigError("--imbalance", "an unmodified script's batches are equal: use 0");
  if (c.order != OrderMode::file) c.order = OrderMode::torch;
  c.policy = Policy::sampler;
  c.validate();
}

PlanConfig config_for_agents(PlanConfig c, std::uint64_t samples, std::uint64_t sample_bytes,
                             std::uint64_t label_bytes, std::uint64_t budget_bytes, bool peers,
                             bool rings) {
  c.samples = samples;
  c.sample_bytes = sample_bytes;
  c.policy = Policy::none;
  c.validate();
  fit_plan_to_agent_budget(c, budget_bytes, label_bytes,
                           kAgentStagingSteps + (rings ? kAgentLookaheadSteps : 0) +
                               (peers && rings ? kPeerHandoverSteps : 0));
  c.policy = Policy::solar;
  c.peer_fetch = peers;
  c.validate();
  return c;
}

std::uint64_t sized_staging_bytes(const PlanConfig& c) {
  const std::uint64_t most =
      c.sized() ? *std::max_element(c.sample_sizes->begin(), c.sample_sizes->end()) : c.sample_bytes;
  return std::uint64_t{kAgentStagingSteps} * c.ranks_per_node * (c.batch + c.imbalance) * most;
}

std::size_t first_size_unlike_planned(const std::vector<std::uint64_t>& sizes,
                                      const std::vector<std::uint64_t>& planned) {
  std::size_t x = 0;
  while (x < sizes.size() && x < planned.size() && agent_sample_slot_bytes(sizes[x]) == planned[x])
    ++x;
  return x;
}

std::uint64_t sized_buffer_bytes(const std::vector<std::uint64_t>& sizes) {
  std::uint64_t total = 0;
  for (std::uint64_t v : sizes) total += agent_sample_slot_bytes(v);
  return total;
}

PlanConfig config_for_sized_samples(PlanConfig c, const std::vector<std::uint64_t>& sizes,
                                    std::uint64_t budget_bytes) {
  if (sizes.empty()) throw ConfigError("--dataset", "the dataset has no samples");
  std::vector<std::uint64_t> units(sizes.size());
  std::transform(sizes.begin(), sizes.end(), units.begin(), agent_sample_slot_bytes);
  const std::uint64_t total = sized_buffer_bytes(sizes);
  c.samples = sizes.size();
  c.sample_sizes = std::make_shared<const std::vector<std::uint64_t>>(std::move(units));
  c.sample_bytes = std::max<std::uint64_t>(1, total / c.samples);
  c.policy = Policy::none;
  c.buffer_bytes = total;  // for the checks of everything but the buffer
  c.validate();
  const std::uint64_t most = *std::max_element(c.sample_sizes->begin(), c.sample_sizes->end());
  const std::uint64_t staging = sized_staging_bytes(c);
  // The resident set holds at least one step of the node's ranks at the largest sample.
  const std::uint64_t least =
      staging + std::uint64_t{c.ranks_per_node} * (c.batch + c.imbalance) * most;
  if (budget_bytes < least)
    throw ConfigError("--buffer", fmt::format("{} per node is too small for these samples of up "
                                              "to {} (as stored, rounded up to 64 bytes): the "
                                              "agent needs at least {} ({} steps of {} ranks × "
                                              "{} samples at the largest)",
                                              format_bytes(budget_bytes), format_bytes(most),
                                              format_bytes(least), kAgentStagingSteps + 1,
                                              c.ranks_per_node, c.batch + c.imbalance));
  c.buffer_bytes = budget_bytes - staging;
  c.policy = Policy::solar;
  c.validate();
  return c;
}

const std::vector<Scenario>& scenarios() {
  static const std::vector<Scenario> v{
      {"seed", 800, 3, 1, 4, 16, 512, "the SOLAR artifact's setup: 800 samples, buffer 512"},
      {"s1", 8192, 10, 4, 4, 16, 1843, "4×4 ranks, buffer 22.5% of N per node"},
      {"s2", 8192, 10, 4, 4, 16, 1024, "4×4 ranks, buffer 12.5% of N per node"},
      {"cosmoflow", 47616, 20, 8, 4, 16, 2976, "CosmoFlow-sized, buffer 6.25% of N per node"},
      {"huge", 1000000, 100, 256, 4, 32, 2000, "1M samples, 100 epochs, 1024 ranks, 0.2%"},
  };
  return v;
}

const Scenario* find_scenario(std::string_view name) {
  for (const auto& s : scenarios())
    if (s.name == name) return &s;
  return nullptr;
}

std::string format_bytes(std::uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.{}f} {}", v, v < 10 ? 2 : (v < 100 ? 1 : 0), units[u]);
}

void check_output_file(const std::string& path, const std::string& flag) {
  if (std::string why = sys::output_file_problem(path); !why.empty()) throw ConfigError(flag, why);
}

std::uint64_t start_global_step(std::optional<std::uint64_t> epoch,
                                std::optional<std::uint64_t> step, std::uint32_t steps_per_epoch,
                                std::uint32_t epochs, const std::string& epoch_flag,
                                const std::string& step_flag) {
  const std::uint64_t total = std::uint64_t{steps_per_epoch} * epochs;
  const std::string length = fmt::format("the plan has {} steps: {} epoch{} of {}", total, epochs,
                                         epochs == 1 ? "" : "s", steps_per_epoch);
  const std::uint64_t e = epoch.value_or(0), s = step.value_or(0);
  if (epoch && e > epochs)
    throw ConfigError(epoch_flag, fmt::format("epoch {} is beyond the end of the plan ({}; "
                                              "epochs are 0..{})",
                                              e, length, epochs - 1));
  if (epoch && s >= steps_per_epoch && !(e == epochs && s == 0))
    throw ConfigError(step_flag, fmt::format("step {} of epoch {} does not exist ({}; steps "
                                             "within an epoch are 0..{})",
                                             s, e, length, steps_per_epoch - 1));
  if (s > total || e * steps_per_epoch > total - s)
    throw ConfigError(epoch ? epoch_flag : step_flag,
                      fmt::format("start at step {} is beyond the end of the plan ({})",
                                  s > total ? s : e * steps_per_epoch + s, length));
  return e * steps_per_epoch + s;
}

}  // namespace solar

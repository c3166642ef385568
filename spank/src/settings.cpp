// SPDX-License-Identifier: Apache-2.0
#include "settings.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "solar/core/job_params.h"
#include "solar/core/order_file.h"
#include "solar/sys/meminfo.h"

namespace solar::spank {
namespace {

// A flag's value: srun passes none, sbatch propagates "(null)", SOLAR_VERBOSE=0 turns it off.
bool is_on(const std::string& v) { return v != "0" && v != "no" && v != "off" && v != "false"; }

// core names its inputs after `solar plan`'s flags; a user of srun gave them as --solar-*.
ConfigError as_srun_error(const ConfigError& e) {
  static const std::pair<const char*, const char*> names[] = {
      {"--buffer", "--solar-buffer"},     {"--batch", "--solar-batch"},
      {"--epochs", "--solar-epochs"},     {"--seed", "--solar-seed"},
      {"--imbalance", "--solar-imbalance"}, {"--order", "--solar-order"},
      {"--order-file", "--solar-order-file"},
      {"--ranks-per-node", "--ntasks-per-node"}, {"--nodes", "-N/--nodes"},
      {"--samples", "--solar-dataset"},   {"--sample-bytes", "--solar-dataset"}};
  std::string message = e.what();
  if (message.rfind(e.flag() + ": ", 0) == 0) message.erase(0, e.flag().size() + 2);
  for (const auto& [from, to] : names)
    if (e.flag() == from) return ConfigError(to, message);
  return e;
}

std::string absolute_path(const std::string& key, const std::string& value) {
  if (value.empty() || value.front() != '/')
    throw ConfigError(key, fmt::format("'{}' is not an absolute path", value));
  std::string v = value;
  while (v.size() > 1 && v.back() == '/') v.pop_back();
  return v;
}

}  // namespace

constexpr const char* kKnownKeys =
    "agent, solar, plan_dir, runtime_dir, max_buffer, provider, on_error, timeout, zero_copy, "
    "transparent, preload, local_dir, max_local_buffer";

PluginConfig PluginConfig::parse(const std::vector<std::string>& args,
                                 const std::string& plugin_path) {
  PluginConfig c;
  if (!plugin_path.empty() && plugin_path.front() == '/') {
    const std::filesystem::path dir = std::filesystem::path(plugin_path).parent_path();
    c.agent = (dir / SOLAR_SPANK_REL_AGENT).lexically_normal().string();
    c.solar = (dir / SOLAR_SPANK_REL_SOLAR).lexically_normal().string();
    c.preload = (dir / SOLAR_SPANK_REL_PRELOAD).lexically_normal().string();
  }
  for (const std::string& arg : args) {
    const auto eq = arg.find('=');
    if (eq == std::string::npos)
      throw ConfigError(arg, fmt::format("plugstack.conf arguments are key=value; known keys: "
                                         "{}",
                                         kKnownKeys));
    const std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
    if (key == "agent") {
      c.agent = absolute_path(key, value);
    } else if (key == "solar") {
      c.solar = absolute_path(key, value);
    } else if (key == "plan_dir") {
      c.plan_dir = absolute_path(key, value);
    } else if (key == "runtime_dir") {
      c.runtime_dir = absolute_path(key, value);
    } else if (key == "max_buffer") {
      c.max_buffer = BufferSpec::parse(value, key);
    } else if (key == "provider") {
      c.provider = value;
    } else if (key == "on_error") {
      if (value == "fallback") c.on_error = OnError::fallback;
      else if (value == "fail") c.on_error = OnError::fail;
      else throw ConfigError(key, fmt::format("'{}' is not fallback or fail", value));
    } else if (key == "zero_copy") {
      if (value == "yes") c.zero_copy = true;
      else if (value == "no") c.zero_copy = false;
      else throw ConfigError(key, fmt::format("'{}' is not yes or no", value));
    } else if (key == "transparent") {
      if (value == "yes") c.allow_transparent = true;
      else if (value == "no") c.allow_transparent = false;
      else throw ConfigError(key, fmt::format("'{}' is not yes or no", value));
    } else if (key == "preload") {
      c.preload = absolute_path(key, value);
    } else if (key == "local_dir") {
      c.local_dir = absolute_path(key, value);
    } else if (key == "max_local_buffer") {
      const BufferSpec b = BufferSpec::parse(value, key);
      if (b.percent >= 0)
        throw ConfigError(key, fmt::format("'{}': give bytes (K/M/G/T), not a percentage", value));
      c.max_local_buffer = b.bytes;
    } else if (key == "timeout") {
      c.timeout_s = static_cast<double>(parse_count(value, key, 1, 3600));
    } else {
      throw ConfigError(key, fmt::format("unknown plugstack.conf argument; known keys: {}",
                                         kKnownKeys));
    }
  }
  return c;
}

const std::vector<OptionSpec>& option_specs() {
  static const std::vector<OptionSpec> specs = {
      {"dataset", "SOLAR_DATASET", "FILE[:DSET]|DIR[:DSET]|GLOB[:DSET]|@LIST[:DSET]|fabric://HOST:PORT/NAME",
       "solar: the training dataset (many files: each file's array one sample, DSET[] its "
       "rows); turns solar on for this step"},
      {"labels", "SOLAR_LABELS", "DSET", "solar: labels dataset in the file ('' for none) "
                                         "[/label]"},
      {"buffer", "SOLAR_BUFFER", "SIZE|PCT%",
       "solar: memory per node (K/M/G/T bytes or a percentage of the dataset)"},
      {"epochs", "SOLAR_EPOCHS", "E", "solar: epochs the job trains for"},
      {"batch", "SOLAR_BATCH", "b", "solar: per-rank batch size"},
      {"seed", "SOLAR_SEED", "s", "solar: shuffle seed [0]"},
      {"order", "SOLAR_ORDER", "solar|torch|unknown",
       "solar: shuffle order; torch = DistributedSampler's; unknown = an unmodified script's "
       "own order (with --solar-transparent: the agents keep what the ranks read, pooled "
       "across the nodes with --solar-peers) [solar]"},
      {"order-file", "SOLAR_ORDER_FILE", "FILE",
       "solar: the script's own order, computed up front (.npy of shape (epochs, samples), or "
       "text ids; each epoch a permutation), read with DistributedSampler(shuffle=False): the "
       "plan follows it exactly (instead of --solar-order)"},
      {"imbalance", "SOLAR_IMBALANCE", "d", "solar: per-rank batch may be b-d..b+d [0]"},
      {"transparent", "SOLAR_TRANSPARENT", nullptr,
       "solar: the script is unmodified (h5py + DistributedSampler): its reads of the dataset "
       "file are served from the node buffer (implies --solar-order=torch; give the script's "
       "seed, batch and epochs)"},
      {"peers", "SOLAR_PEERS", nullptr,
       "solar: the nodes' agents share their buffers: a node's miss on a sample another node "
       "holds is read from that node over libfabric (plugstack provider=), not from storage"},
      {"local-buffer", "SOLAR_LOCAL_BUFFER", "SIZE|PCT%",
       "solar: a tier on each node's local disk below --solar-buffer (K/M/G/T bytes or a "
       "percentage of the dataset): the plan keeps both resident and the agents move samples "
       "between memory and the disk ahead of the ranks (plugstack local_dir=)"},
      {"start-epoch", "SOLAR_START_EPOCH", "E",
       "solar: resume (requeued job, training checkpoint): start at this epoch; the agents "
       "begin there and the ranks get only the rest of the plan [0]"},
      {"start-step", "SOLAR_START_STEP", "S",
       "solar: resume at this step of --solar-start-epoch (without it: this global step) [0]"},
      {"verbose", "SOLAR_VERBOSE", nullptr, "solar: say what is planned and each node's hits"},
      {"stats", "SOLAR_STATS", "PATH",
       "solar: write the step's measured statistics (per node and epoch: hits, fetches, bytes, "
       "read time, stall; the agents' head start) to this JSON file when the step ends; %j and %s "
       "are the job and step ids"},
      {"plan", "SOLAR_PLAN_MODE", "auto|whole|streamed",
       "solar: how the plan reaches the nodes: whole (computed in srun, every access in its "
       "file in plan_dir), streamed (the file is the inputs alone; each node computes its share "
       "as the step goes: no plan-sized file, start-up independent of the epochs), auto "
       "(streamed above 2^24 accesses) [auto]"},
      {"", "SOLAR", "off", "solar: --solar=off disables solar for this step"},
  };
  return specs;
}

void JobOptions::set(int field, const std::string& text) {
  const std::string flag = fmt::format("--solar{}{}", *option_specs()[field].name ? "-" : "",
                                       option_specs()[field].name);
  switch (field) {
    case dataset:
      if (text.empty()) throw ConfigError(flag, "is empty; give FILE[:DSET] or fabric://...");
      break;
    case buffer:
    case local_buffer: BufferSpec::parse(text, flag); break;
    case epochs: parse_job_param(text, flag, job_params::kEpochs); break;
    case batch: parse_job_param(text, flag, job_params::kBatch); break;
    case seed: parse_job_param(text, flag, job_params::kSeed); break;
    case imbalance: parse_job_param(text, flag, job_params::kImbalance); break;
    case start_epoch: parse_job_param(text, flag, job_params::kStartEpoch); break;
    case start_step: parse_job_param(text, flag, job_params::kStartStep); break;
    case order:
      if (text != "unknown" && !parse_order_mode(text))
        throw ConfigError(flag, fmt::format("'{}' is not solar, torch or unknown", text));
      break;
    case stats:
      if (text.empty()) throw ConfigError(flag, "is empty; give the JSON file to write");
      break;
    case order_file:
      if (text.empty()) throw ConfigError(flag, "is empty; give the order's .npy or text file");
      break;
    case plan:
      if (!parse_plan_delivery(text))
        throw ConfigError(flag, fmt::format("'{}' is not auto, whole or streamed", text));
      break;
    case enable:
      if (text != "off" && text != "on")
        throw ConfigError(flag, fmt::format("'{}' is not off or on", text));
      break;
    default: break;
  }
  value[field] = text;
  from_command_line[field] = true;
}

void JobOptions::add_environment(const std::function<const char*(const char*)>& getenv) {
  // Inside a solar step the SOLAR_* variables describe that step, not settings for a new one.
  if (getenv("SOLAR_STEP")) return;
  for (int f = 0; f < kFields; ++f) {
    if (from_command_line[f]) continue;
    const char* v = getenv(option_specs()[f].env);
    if (!v) continue;
    const std::string flag = option_specs()[f].env;
    try {
      set(f, v);
    } catch (const ConfigError& e) {
      std::string message = e.what();
      message.erase(0, e.flag().size() + 2);
      throw ConfigError(flag, message);
    }
    from_command_line[f] = false;
  }
}

bool JobOptions::off() const { return value[enable] && *value[enable] == "off"; }
bool JobOptions::is_verbose() const { return value[verbose] && is_on(*value[verbose]); }
bool JobOptions::is_transparent() const {
  return value[transparent] && is_on(*value[transparent]);
}

bool JobOptions::is_peers() const { return value[peers] && is_on(*value[peers]); }

bool JobOptions::order_unknown() const { return value[order] && *value[order] == "unknown"; }

bool JobOptions::active() const {
  if (off()) return false;
  for (int f = 0; f < kFields; ++f)
    if (f != enable && f != verbose && f != transparent && f != peers && f != stats &&
        f != start_epoch && f != plan &&
        f != start_step && value[f])
      return true;
  return false;
}

void JobOptions::validate() const {
  if (!value[dataset])
    throw ConfigError("--solar-dataset", "is required when any --solar-* option is given (or "
                                         "--solar=off to turn solar off)");
  for (int f : {buffer, epochs, batch})
    if (!value[f])
      throw ConfigError(fmt::format("--solar-{}", option_specs()[f].name),
                        fmt::format("is required with --solar-dataset ({})",
                                    option_specs()[f].arginfo));
}

PlanDelivery JobOptions::plan_delivery() const {
  return value[plan] ? *parse_plan_delivery(*value[plan]) : PlanDelivery::automatic;
}

PlanConfig JobOptions::partial_config() const {
  PlanConfig c;
  c.epochs = parse_job_param32(*value[epochs], "--solar-epochs", job_params::kEpochs);
  c.batch = parse_job_param32(*value[batch], "--solar-batch", job_params::kBatch);
  c.seed = value[seed] ? parse_job_param(*value[seed], "--solar-seed", job_params::kSeed) : 0;
  c.imbalance = value[imbalance] ? parse_job_param32(*value[imbalance], "--solar-imbalance",
                                                     job_params::kImbalance)
                                 : 0;
  // unknown: the plan (torch order) lays the buffer out; the agents keep what the ranks read.
  c.order = order_unknown()  ? OrderMode::torch
            : value[order] ? *parse_order_mode(*value[order])
                           : OrderMode::solar;
  return c;
}

std::uint64_t JobOptions::start_step_in(std::uint32_t steps_per_epoch,
                                        std::uint32_t plan_epochs) const {
  std::optional<std::uint64_t> e, st;
  if (value[start_epoch])
    e = parse_job_param(*value[start_epoch], "--solar-start-epoch", job_params::kStartEpoch);
  if (value[start_step])
    st = parse_job_param(*value[start_step], "--solar-start-step", job_params::kStartStep);
  if (!e && !st) return 0;
  return start_global_step(e, st, steps_per_epoch, plan_epochs, "--solar-start-epoch",
                           "--solar-start-step");
}

BufferSpec JobOptions::buffer_spec() const {
  return BufferSpec::parse(*value[buffer], "--solar-buffer");
}

PlanConfig plan_config_for_step(const JobOptions& o, const PluginConfig& pc,
                                const DatasetShape& info, std::uint32_t nodes,
                                std::uint32_t ranks_per_node, std::uint64_t node_memory,
                                std::string* notes) {
  try {
    o.validate();
    if (o.is_transparent() && !pc.allow_transparent)
      throw ConfigError("--solar-transparent", "this site does not allow it (plugstack.conf "
                                               "transparent=no); use solar's loader in the "
                                               "script instead");
    // Whole files (npz, JPEG, any file: one sample a file): in batch mode libsolar hands each
    // sample's bytes and length (the script decodes them), served zero copy by the agents.
    if (info.whole_files && !o.is_transparent() && o.is_peers() && nodes > 1)
      throw ConfigError("--solar-peers",
                        "the dataset is whole-file samples (npz, JPEG, any file: one sample a "
                        "file), which agents do not share between nodes in batch mode yet; drop "
                        "--solar-peers or add --solar-transparent");
    PlanConfig c = o.partial_config();
    c.nodes = nodes;
    c.ranks_per_node = ranks_per_node;
    const std::uint64_t label = info.label_bytes;
    // Transparent over filtered chunks: the agent buffers them as stored (agent.cpp).
    const bool as_stored = o.is_transparent() || info.whole_files;
    const std::uint64_t sample_bytes = as_stored && info.stored_sample_bytes
                                           ? info.stored_sample_bytes
                                           : info.sample_bytes;
    std::uint64_t budget =
        o.buffer_spec().resolve(info.samples, agent_slot_bytes(sample_bytes, label));
    if (const auto limit = buffer_cap(pc, node_memory)) {
      const std::uint64_t cap = *limit;
      if (budget > cap) {
        if (notes)
          *notes = fmt::format("--solar-buffer {} is above the site's limit; using {} per node",
                               format_bytes(budget), format_bytes(cap));
        budget = cap;
      }
    }
    // Peer sharing: on one node there is no one to share with (off).
    // Samples of differing sizes as stored: the plan counts their bytes (solar run does the
    // same): --solar-buffer 64% is of those bytes, the site's limit applies to it. With peers,
    // slots of the largest (agents share samples of one slot size only).
    if (as_stored && !info.stored_sizes.empty() && !(o.is_peers() && nodes > 1)) {
      std::uint64_t bytes = o.buffer_spec().resolve(sized_buffer_bytes(info.stored_sizes), 1);
      if (notes) notes->clear();  // the note above was of the slots of the largest
      if (const auto limit = buffer_cap(pc, node_memory); limit && bytes > *limit) {
        if (notes)
          *notes = fmt::format("--solar-buffer {} is above the site's limit; using {} per node",
                               format_bytes(bytes), format_bytes(*limit));
        bytes = *limit;
      }
      c = config_for_sized_samples(c, info.stored_sizes, bytes);
    } else {
      c = config_for_agents(c, info.samples, sample_bytes, label, budget,
                            o.is_peers() && nodes > 1, !pc.zero_copy && !o.is_transparent());
    }
    if (const auto& file = o.value[JobOptions::order_file]) {
      if (o.value[JobOptions::order])
        throw ConfigError("--solar-order-file", "gives the order itself: drop --solar-order");
      follow_order_file(c, *file);
    }
    if (const auto& local = o.value[JobOptions::local_buffer]) {
      if (pc.local_dir.empty())
        throw ConfigError("--solar-local-buffer", "this site has no local tier (plugstack.conf "
                                                  "local_dir=); drop the option");
      if (o.is_peers() && nodes > 1)
        throw ConfigError("--solar-local-buffer", "a local tier and --solar-peers do not go "
                                                  "together yet");
      c.local_bytes = BufferSpec::parse(*local, "--solar-local-buffer")
                          .resolve(c.samples, c.sample_bytes);
      if (pc.max_local_buffer && c.local_bytes > *pc.max_local_buffer) {
        if (notes)
          *notes += fmt::format("{}--solar-local-buffer {} is above the site's limit; using {} "
                                "per node",
                                notes->empty() ? "" : "; ", format_bytes(c.local_bytes),
                                format_bytes(*pc.max_local_buffer));
        c.local_bytes = *pc.max_local_buffer;
      }
      c.validate();
    }
    if (o.order_unknown()) {
      if (!o.is_transparent())
        throw ConfigError("--solar-order", "unknown is for an unmodified script "
                                           "(--solar-transparent): solar's own loader reads the "
                                           "plan's order");
      if (o.value[JobOptions::local_buffer])
        throw ConfigError("--solar-order", "unknown (demand mode) is not built with "
                                           "--solar-local-buffer yet: drop one");
    }
    if (o.is_transparent())
      follow_the_script(c, o.value[JobOptions::order].has_value() && !o.order_unknown());
    return c;
  } catch (const ConfigError& e) {
    throw as_srun_error(e);
  }
}

DatasetShape DatasetShape::parse(const std::string& line) {
  auto unreadable = [](const std::string& why) {
    return ConfigError("--solar-dataset",
                       fmt::format("unreadable reply from `solar dataset-info` ({}); is the "
                                   "plugstack.conf solar= tool from the same release?",
                                   why));
  };
  // A size or count: a non-negative JSON integer (get<std::uint64_t> of -1.5 or 1e300 is
  // undefined behaviour: fuzz.spank_settings).
  auto count = [&](const nlohmann::json& j, const char* key) {
    const nlohmann::json& v = j.at(key);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
      throw unreadable(fmt::format("{} is {}", key, v.dump()));
    return v.get<std::uint64_t>();
  };
  try {
    const auto j = nlohmann::json::parse(line);
    DatasetShape d;
    d.samples = count(j, "samples");
    d.sample_bytes = count(j, "sample_bytes");
    if (j.contains("stored_sample_bytes")) d.stored_sample_bytes = count(j, "stored_sample_bytes");
    d.label_bytes = count(j, "label_bytes");
    if (j.contains("whole_files")) d.whole_files = j.at("whole_files").get<bool>();
    if (j.contains("stored_sizes")) {
      const nlohmann::json& v = j.at("stored_sizes");
      if (!v.is_array() || v.size() != d.samples)
        throw unreadable(fmt::format("stored_sizes is not an array of {} sizes", d.samples));
      d.stored_sizes.reserve(v.size());
      for (const nlohmann::json& x : v) {
        if (!x.is_number_unsigned() || x.get<std::uint64_t>() == 0 ||
            x.get<std::uint64_t>() > (std::uint64_t{1} << 40))
          throw unreadable(fmt::format("a stored size is {}", x.dump()));
        d.stored_sizes.push_back(x.get<std::uint64_t>());
      }
    }
    d.identity = j.at("identity").get<std::string>();
    return d;
  } catch (const nlohmann::json::exception& e) {
    throw unreadable(e.what());
  }
}

std::string job_prefix(std::uint32_t job) { return fmt::format("solar-{}.", job); }

std::optional<std::uint64_t> buffer_cap(const PluginConfig& pc, std::uint64_t node_memory) {
  if (!pc.max_buffer) return std::nullopt;
  return pc.max_buffer->percent >= 0
             ? static_cast<std::uint64_t>(pc.max_buffer->percent / 100.0 *
                                          static_cast<double>(node_memory))
             : pc.max_buffer->bytes;
}

bool plan_is_transparent(const PlanConfig& c) { return c.policy == Policy::sampler; }

std::string step_local_dir(const PluginConfig& pc, std::uint32_t job, std::uint32_t step,
                           std::uint32_t node) {
  return fmt::format("{}/{}{}.{}", pc.local_dir, job_prefix(job), step, node);
}

std::string step_runtime_dir(const PluginConfig& pc, std::uint32_t job, std::uint32_t step,
                             std::uint32_t node) {
  return fmt::format("{}/{}{}.{}", pc.runtime_dir, job_prefix(job), step, node);
}

// Unknown is 0, not sys::mem_available_bytes's "no limit": this is the base of max_buffer's
// percentage, and an admin's cap of a size nobody knows must refuse, not allow, any buffer.
std::uint64_t node_memory_bytes() { return sys::meminfo_bytes("MemTotal").value_or(0); }

}  // namespace solar::spank

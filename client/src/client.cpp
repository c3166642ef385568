// SPDX-License-Identifier: Apache-2.0
// libsolar: see solar.h. Two paths behind one API: batches from the node agent's shared buffer
// (the plan's samples, handed out as slots), or the same samples read directly from storage.
// This file is the C API; the loader it drives is loader.h.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_runtime.h"
#include "environment.h"
#include "loader.h"
#include "solar/core/plan_file.h"
#include "solar/core/plan_stream.h"
#include "solar/solar.h"

using solar::client::agent_timeout_from_env;
using solar::client::ClientError;
using solar::client::env;
using solar::client::env_u32;
using solar::client::multi_process_launch;
#ifdef SOLAR_WITH_CUDA
using solar::client::Cuda;
using solar::client::cuda;
#endif

namespace {

// Calls f(i, k) for each run [i, k) of a batch's samples (or labels) that lie one after another
// in memory, `each` bytes apart: a ring's batch of samples whose size is a multiple of 64 is one
// run (slots hold the samples alone, labels apart), and so are its labels; each run is then
// copied at once, not sample by sample.
template <class F>
void for_each_run(const std::vector<const std::byte*>& from, std::size_t each, F&& f) {
  for (std::size_t i = 0; i < from.size();) {
    std::size_t k = i + 1;
    while (k < from.size() && from[k] == from[i] + (k - i) * each) ++k;
    f(i, k);
    i = k;
  }
}

// The batch's samples back to back, as runs that lie back to back in memory too: f(out
// offset, first sample's address, bytes), once per run. Each sample is its own length (a sized
// plan's whole files) or the loader's sample bytes.
template <class F>
void for_each_extent(const solar_batch& b, F&& f) {
  const solar_loader& l = *b.loader;
  std::uint64_t out = 0;
  for (std::size_t i = 0; i < b.samples.size();) {
    std::uint64_t len = l.length_of(b.samples[i]);
    std::size_t k = i + 1;
    while (k < b.samples.size() && b.data[k] == b.data[i] + len) len += l.length_of(b.samples[k++]);
    f(out, b.data[i], len);
    out += len;
    i = k;
  }
}

thread_local std::string g_last_error;

// FNV-1a, 64 bits: the plan's fingerprint.
struct Fnv {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  template <class T>
  void add(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    unsigned char b[sizeof v];
    std::memcpy(b, &v, sizeof v);
    for (unsigned char c : b) h = (h ^ c) * 0x100000001b3ULL;
  }
};

}  // namespace

extern "C" {

const char* solar_last_error(void) { return g_last_error.c_str(); }
const char* solar_version(void) { return SOLAR_VERSION_STRING; }

solar_loader* solar_open_env(void) {
  try {
    auto l = std::make_unique<solar_loader>();
    const char* plan_env = std::getenv("SOLAR_PLAN");
    if (!plan_env || !*plan_env)
      throw ClientError("SOLAR_PLAN is not set: run under `solar run` or `srun --solar-*`, or "
                        "make a plan (`solar plan --samples N --sample-bytes B --batch b "
                        "--epochs E --buffer X --out FILE`) and set SOLAR_PLAN to that file");
    const std::string plan_path = plan_env;
    const auto node = env_u32("SOLAR_NODE");
    const auto local_rank = env_u32("SOLAR_LOCAL_RANK", "LOCAL_RANK");
    const char* dataset_env = std::getenv("SOLAR_DATASET");
    if (!dataset_env || !*dataset_env)
      throw ClientError(fmt::format("SOLAR_DATASET is not set: set it to the dataset the plan {} "
                                    "was made for (FILE.h5[:/dataset] or "
                                    "fabric://HOST:PORT/NAME)",
                                    plan_path));
    l->where.dataset = dataset_env;
    l->where.labels = env("SOLAR_LABELS", "/label");
    const solar::PlanFile pf = solar::PlanFile::open(plan_path);
    l->header = pf.header();
    // Standalone (one process, no launcher): node 0, local rank 0. A process that a launcher
    // started as one of several must be told which rank it is: all of them being rank 0 would
    // train on the same samples.
    {
      const auto& c = l->header.config;
      const bool need_node = !node && c.nodes > 1;
      const bool need_rank = !local_rank && c.ranks_per_node > 1;
      if (need_node || need_rank) {
        const std::string missing = need_node && need_rank ? "SOLAR_NODE and SOLAR_LOCAL_RANK are"
                                    : need_node ? "SOLAR_NODE is"
                                                : "SOLAR_LOCAL_RANK (or LOCAL_RANK) is";
        if (const std::string launch = multi_process_launch(); !launch.empty())
          throw ClientError(fmt::format(
              "{} not set but this process is one of several ({}) and the plan {} has {} "
              "node{} x {} rank{} per node: run under `solar run` or `srun --solar-*`, or set "
              "{}",
              missing, launch, plan_path, c.nodes, c.nodes == 1 ? "" : "s", c.ranks_per_node,
              c.ranks_per_node == 1 ? "" : "s", need_node && need_rank ? "them" : "it"));
        std::fprintf(stderr,
                     "solar: %s not set: reading as node %u, local rank %u, one of the %llu "
                     "ranks of the plan %s (set %s to read another rank's batches)\n",
                     missing.c_str(), node.value_or(0), local_rank.value_or(0),
                     static_cast<unsigned long long>(c.world()), plan_path.c_str(),
                     need_node && need_rank ? "them" : "it");
      }
    }
    l->node = node.value_or(0);
    l->local_rank = local_rank.value_or(0);
    if (l->node >= l->header.config.nodes)
      throw ClientError(fmt::format("SOLAR_NODE={} but the plan {} has nodes 0..{}", l->node,
                                    plan_path, l->header.config.nodes - 1));
    l->R = l->header.config.ranks_per_node;
    if (l->local_rank >= l->R)
      throw ClientError(fmt::format("SOLAR_LOCAL_RANK={} but the plan has {} ranks per node",
                                    l->local_rank, l->R));
    // A streamed plan: this node's steps are computed here when needed (planned()).
    if (!l->header.streamed) l->plan = pf.node(l->node);
    // Samples of differing sizes (whole files): each one's length is its file's size.
    if (l->header.config.sized()) l->read_lengths();
    l->T = std::uint64_t{l->header.layout.steps} * l->header.config.epochs;
    {  // Resume: where the launcher (solar run --start-*, srun --solar-start-*) starts the job.
      auto start_var = [](const char* name) -> std::optional<std::uint64_t> {
        const char* v = std::getenv(name);
        if (!v || !*v) return std::nullopt;
        try {
          return solar::parse_count(v, name, 0, ~std::uint64_t{0});
        } catch (const solar::ConfigError& e) {
          throw ClientError(e.what());
        }
      };
      const auto e = start_var("SOLAR_START_EPOCH"), st = start_var("SOLAR_START_STEP");
      if (e || st) {
        try {
          l->cursor = solar::start_global_step(e, st, l->header.layout.steps,
                                               l->header.config.epochs, "SOLAR_START_EPOCH",
                                               "SOLAR_START_STEP");
        } catch (const solar::ConfigError& err) {
          throw ClientError(fmt::format("{} (plan {})", err.what(), plan_path));
        }
        l->start_given = true;
      }
    }
    if (const char* s = std::getenv("SOLAR_SOCKET"); s && *s) {
      l->agent_timeout = agent_timeout_from_env();
      l->where.socket_path = s;
      l->attach();
    }
    if (l->sock < 0) l->open_source();  // fail now, not at the first batch
    l->first = l->cursor;
    g_last_error.clear();
    return l.release();
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return nullptr;
  }
}

void solar_close(solar_loader* l) { delete l; }

int solar_using_agent(const solar_loader* l) { return l && l->sock >= 0; }
uint32_t solar_epochs(const solar_loader* l) { return l->header.config.epochs; }
uint32_t solar_steps_per_epoch(const solar_loader* l) { return l->header.layout.steps; }
uint64_t solar_sample_bytes(const solar_loader* l) { return l->format.sample_bytes; }
uint64_t solar_label_bytes(const solar_loader* l) { return l->format.label_bytes; }
uint64_t solar_dataset_samples(const solar_loader* l) { return l->header.config.samples; }
int solar_sample_shape(const solar_loader* l, uint64_t* dims, int max_dims) {
  if (!l || !l->format.shape) return -1;
  const auto& sh = *l->format.shape;
  const std::size_t room = dims ? static_cast<std::size_t>(std::max(max_dims, 0)) : 0;
  for (std::size_t i = 0; i < sh.size() && i < room; ++i) dims[i] = sh[i];
  return static_cast<int>(sh.size());
}
const char* solar_sample_dtype(const solar_loader* l) { return l ? l->format.dtype.c_str() : ""; }
const char* solar_label_dtype(const solar_loader* l) { return l ? l->format.label_dtype.c_str() : ""; }
uint32_t solar_rank(const solar_loader* l) { return l->node * l->R + l->local_rank; }
uint32_t solar_world_size(const solar_loader* l) {
  return static_cast<uint32_t>(l->header.config.world());
}

int solar_next_batch(solar_loader* l, solar_batch** out) {
  try {
    if (!l || !out) throw ClientError("solar_next_batch: NULL argument");
    if (l->holding)
      throw ClientError(fmt::format("solar_next_batch: step {} is still held; call solar_release "
                                    "first",
                                    l->batch.step));
    if (l->cursor >= l->T) return 0;
    solar_batch& b = l->batch;
    b.loader = l;
    b.step = l->cursor;
    b.epoch = static_cast<std::uint32_t>(l->cursor / l->header.layout.steps);
    b.mean_size = l->header.layout.rank_batch(
        static_cast<std::uint32_t>(l->cursor % l->header.layout.steps));
    auto from_the_plan = [&] {
      const auto want = l->planned(l->cursor);
      b.samples.resize(want.size());
      for (std::size_t i = 0; i < want.size(); ++i) b.samples[i] = want[i] & solar::kSampleMask;
    };
    // A streamed plan's batch from the agent is the agent's (next_from_agent fills it).
    const bool agents_batch = l->header.streamed && l->sock >= 0;
    if (!agents_batch) from_the_plan();
    l->holding_from_agent = l->next_from_agent();
    if (!l->holding_from_agent) {
      if (agents_batch) from_the_plan();  // the agent is gone: the plan's batch, computed here
      l->next_direct();
    }
    ++l->cursor;
    l->holding = true;
    *out = &b;
    return 1;
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return -1;
  }
}

int solar_skip_to(solar_loader* l, uint64_t global_step) {
  try {
    if (!l) throw ClientError("solar_skip_to: NULL loader");
    if (l->holding)
      throw ClientError(fmt::format("solar_skip_to: step {} is still held; call solar_release "
                                    "first",
                                    l->batch.step));
    if (global_step > l->T)
      throw ClientError(fmt::format("solar_skip_to: step {} is beyond the end of the plan ({} "
                                    "steps: {} epochs of {})",
                                    global_step, l->T, l->header.config.epochs,
                                    l->header.layout.steps));
    if (global_step < l->first)
      throw ClientError(fmt::format("solar_skip_to: step {} is before step {}, where this "
                                    "launch started (SOLAR_START_EPOCH/SOLAR_START_STEP or the "
                                    "agent's start): its agent never serves earlier steps; "
                                    "launch the job at step {} (solar run --start-step, srun "
                                    "--solar-start-step)",
                                    global_step, l->first, global_step));
    if (global_step < l->cursor)
      throw ClientError(fmt::format("solar_skip_to: step {} was already served (the next step is "
                                    "{}); steps run forward only: open a new loader",
                                    global_step, l->cursor));
    // With an agent: it runs the plan in order, so the steps before are taken and released
    // (its reads happen; nothing is copied here). Without one (or once it is gone), or to the
    // step the loader is at (the agent's start after a resumed launch): a cursor move, no
    // reads.
    l->skip_with_agent(global_step);
    g_last_error.clear();
    return 0;
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return -1;
  }
}

uint64_t solar_position(const solar_loader* l) { return l->cursor; }
uint32_t solar_batch_per_rank(const solar_loader* l) { return l->header.config.batch; }

uint64_t solar_plan_fingerprint(const solar_loader* l) {
  const solar::PlanHeader& h = l->header;
  const solar::PlanConfig& c = h.config;
  Fnv f;
  for (std::uint64_t v : {c.samples, c.sample_bytes, c.seed, c.buffer_bytes}) f.add(v);
  for (std::uint32_t v : {c.epochs, c.nodes, c.ranks_per_node, c.batch, c.imbalance,
                          h.layout.steps, static_cast<std::uint32_t>(c.order),
                          static_cast<std::uint32_t>(c.policy), std::uint32_t{c.drop_last},
                          std::uint32_t{c.peer_fetch}})
    f.add(v);
  for (std::uint32_t e : h.epoch_order) f.add(e);
  // Each node section's checksum: every rank's batches and every node's schedule.
  for (const auto& d : h.directory) {
    f.add(d.length);
    f.add(d.crc);
  }
  return f.h;
}

int solar_release(solar_loader* l, solar_batch* b) {
  if (!l || b != &l->batch || !l->holding) {
    g_last_error = "solar_release: not the batch this loader handed out";
    return -1;
  }
  l->holding = false;
  if (l->holding_from_agent && l->sock >= 0) l->releases.note(b->step);
  return 0;
}

size_t solar_batch_size(const solar_batch* b) { return b->samples.size(); }
uint64_t solar_batch_step(const solar_batch* b) { return b->step; }
uint32_t solar_batch_epoch(const solar_batch* b) { return b->epoch; }
uint64_t solar_batch_index(const solar_batch* b, size_t i) { return b->samples[i]; }
const void* solar_batch_sample(const solar_batch* b, size_t i) { return b->data[i]; }
uint64_t solar_batch_sample_bytes(const solar_batch* b, size_t i) {
  return b->loader->length_of(b->samples[i]);
}
uint64_t solar_batch_bytes(const solar_batch* b) { return b->bytes(); }
int solar_sample_sizes_differ(const solar_loader* l) { return l && !l->lengths.empty(); }
const void* solar_batch_label(const solar_batch* b, size_t i) { return b->labels[i]; }
double solar_batch_mean_size(const solar_batch* b) { return b->mean_size; }

int solar_batch_gather(const solar_batch* b, void* data, size_t data_bytes, void* labels,
                       size_t labels_bytes) {
  if (!b || !b->loader) {
    g_last_error = "solar_batch_gather: NULL batch";
    return -1;
  }
  const solar_loader* l = b->loader;
  const std::size_t n = b->samples.size();
  const std::uint64_t lb = l->format.label_bytes;
  const std::uint64_t need = data ? b->bytes() : 0;
  if (data && data_bytes < need) {
    g_last_error =
        l->lengths.empty()
            ? fmt::format("solar_batch_gather: the data buffer has {} bytes, the batch needs {} "
                          "({} samples of {})",
                          data_bytes, need, n, l->format.sample_bytes)
            : fmt::format("solar_batch_gather: the data buffer has {} bytes, the batch needs {} "
                          "({} samples of differing sizes: solar_batch_bytes)",
                          data_bytes, need, n);
    return -1;
  }
  if (labels && !lb) {
    g_last_error = "solar_batch_gather: the dataset has no labels (pass NULL)";
    return -1;
  }
  if (labels && labels_bytes < n * lb) {
    g_last_error = fmt::format("solar_batch_gather: the labels buffer has {} bytes, the batch "
                               "needs {}",
                               labels_bytes, n * lb);
    return -1;
  }
  auto* dout = static_cast<std::byte*>(data);
  auto* lout = static_cast<std::byte*>(labels);
  if (dout)
    for_each_extent(*b, [&](std::uint64_t at, const std::byte* from, std::uint64_t len) {
      std::memcpy(dout + at, from, len);
    });
  if (lout)
    for_each_run(b->labels, lb, [&](std::size_t i, std::size_t k) {
      std::memcpy(lout + i * lb, b->labels[i], (k - i) * lb);
    });
  return 0;
}

int solar_cuda_available(void) {
#ifdef SOLAR_WITH_CUDA
  const Cuda& cu = cuda();
  if (!cu.missing.empty()) {
    g_last_error = "no GPU: " + cu.missing;
    return 0;
  }
  int n = 0;
  const int e = cu.GetDeviceCount(&n);
  // Without a driver this is cudaErrorInsufficientDriver (35), not cudaErrorNoDevice (100).
  if (e != 0 || n == 0) {
    g_last_error = fmt::format("no GPU: {}", e == 0 ? "no device" : cu.GetErrorString(e));
    return 0;
  }
  return 1;
#else
  g_last_error = "libsolar was built without CUDA (SOLAR_WITH_CUDA off)";
  return 0;
#endif
}

int solar_batch_copy_to_device(const solar_batch* b, void* dst, void* stream) {
#ifdef SOLAR_WITH_CUDA
  if (!b || !b->loader || !dst) {
    g_last_error = "solar_batch_copy_to_device: NULL argument";
    return -1;
  }
  if (!solar_cuda_available()) return -1;
  solar_loader* l = b->loader;
  const Cuda& cu = cuda();
  if (!l->pin.registered && !l->pin.failed && l->base) {
    const int e = cu.HostRegister(l->base, l->map_bytes,
                                  Cuda::kRegisterPortable | Cuda::kRegisterReadOnly);
    l->pin.registered = e == 0;
    if (!l->pin.registered) {
      std::fprintf(stderr, "solar: pinning the shared buffer failed (%s); copies are staged\n",
                   cu.GetErrorString(e));
      cu.GetLastError();
      l->pin.failed = true;
    }
  }
  auto* out = static_cast<std::byte*>(dst);
  int e = 0;
  for_each_extent(*b, [&](std::uint64_t at, const std::byte* from, std::uint64_t len) {
    if (e == 0) e = cu.MemcpyAsync(out + at, from, len, Cuda::kHostToDevice, stream);
  });
  if (e != 0) {
    g_last_error = fmt::format("solar_batch_copy_to_device: {}", cu.GetErrorString(e));
    return -1;
  }
  return 0;
#else
  (void)b;
  (void)dst;
  (void)stream;
  g_last_error = "libsolar was built without CUDA (SOLAR_WITH_CUDA off)";
  return -1;
#endif
}

}  // extern "C"

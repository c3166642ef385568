// solar gen: write a generated dataset (content checkable from (seed, index)).
// solar verify: read a source and check every byte against the generator.
// solar bench io: per-sample random reads vs coalesced runs vs a sequential read.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "options.h"
#include "progress.h"
#include "solar/core/config.h"
#include "solar/core/rng.h"
#include "solar/storage/content.h"
#include "solar/storage/fabric_source.h"
#include "solar/storage/hdf5_writer.h"
#include "solar/storage/sample_source.h"

namespace solar::cli {
namespace {

using storage::SampleRun;
using storage::StorageError;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double gbps(std::uint64_t bytes, double s) { return s > 0 ? double(bytes) / s / 1e9 : 0; }

int usage(const std::string& cmd, const std::string& msg) {
  std::fprintf(stderr, "solar %s: %s\n", cmd.c_str(), msg.c_str());
  return kExitUsage;
}

// ---------------------------------------------------------------------------- gen

struct GenOptions {
  std::string out;
  std::optional<std::uint64_t> samples;
  std::string preset = "cosmoflow";
  std::optional<std::string> shape, dtype;
  std::string layout = "contiguous";
  std::uint64_t seed = 0;
  bool force = false;
  bool yes = false;
  bool progress = true;
};

// `solar gen` asks for --yes before writing more than this; it never writes more than the
// free space of the target's file system.
constexpr std::uint64_t kGenConfirmBytes = 10ULL << 30;
// Datasets from this size on are announced (size, free space) before writing starts.
constexpr std::uint64_t kGenAnnounceBytes = 1ULL << 30;

struct Preset {
  const char* name;
  std::vector<std::uint64_t> shape;
  const char* dtype;
};
const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {{"cosmoflow", {4, 128, 128, 128}, "int16"},  // 16 MiB
                                        {"small", {4, 32, 32, 32}, "int16"},         // 256 KiB
                                        {"tiny", {4, 8, 8, 8}, "int16"}};            // 4 KiB
  return p;
}

std::vector<std::uint64_t> parse_shape(const std::string& s) {
  std::vector<std::uint64_t> dims;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    const std::size_t comma = std::min(s.find_first_of(",x", pos), s.size());
    const std::string part = s.substr(pos, comma - pos);
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos ||
        part.size() > 12)
      throw ConfigError("--shape", fmt::format("'{}' is not a list of positive integers such as "
                                               "4,128,128,128",
                                               s));
    dims.push_back(std::stoull(part));
    if (dims.back() == 0) throw ConfigError("--shape", "every dimension must be at least 1");
    pos = comma + 1;
  }
  return dims;
}

void run_gen(const GenOptions& o) {
  storage::GenSpec spec;
  try {
    spec.path = o.out;
    if (!o.samples) throw ConfigError("--samples", "required (number of samples, ≥ 1)");
    if (*o.samples == 0 || *o.samples > kMaxSamples)
      throw ConfigError("--samples", fmt::format("must be in 1..{}", kMaxSamples));
    spec.samples = *o.samples;
    const Preset* p = nullptr;
    for (const auto& x : presets())
      if (o.preset == x.name) p = &x;
    if (!p) throw ConfigError("--preset", fmt::format("'{}' is not cosmoflow, small or tiny", o.preset));
    spec.shape = o.shape ? parse_shape(*o.shape) : p->shape;
    const std::string dt = o.dtype.value_or(p->dtype);
    auto dtype = storage::parse_dtype(dt);
    if (!dtype)
      throw ConfigError("--dtype", fmt::format("'{}' is not one of int8, uint8, int16, uint16, "
                                               "int32, uint32, int64, uint64, float32, float64",
                                               dt));
    spec.dtype = *dtype;
    if (o.layout == "contiguous") spec.layout = storage::Layout::contiguous;
    else if (o.layout == "chunked") spec.layout = storage::Layout::chunked;
    else if (o.layout == "gzip") spec.layout = storage::Layout::gzip;
    else throw ConfigError("--layout", fmt::format("'{}' is not contiguous, chunked or gzip", o.layout));
    spec.seed = o.seed;
    spec.force = o.force;
    std::error_code ec;
    if (std::filesystem::exists(o.out, ec) && !o.force)
      throw ConfigError("OUT", fmt::format("{} already exists; pass --force to replace it", o.out));
  } catch (const ConfigError& e) {
    exit_code() = usage("gen", e.what());
    return;
  }
  std::uint64_t sb = storage::dtype_size(spec.dtype);
  for (auto d : spec.shape) {
    if (sb > kMaxSampleBytes / d) {
      exit_code() = usage("gen", "--shape: a sample must be under 1 TiB");
      return;
    }
    sb *= d;
  }
  // What it will write (data and one int32 label per sample), against the free space.
  const std::uint64_t per = sb + 4;
  const bool huge = per > ~std::uint64_t{0} / spec.samples;
  const std::uint64_t total = huge ? ~std::uint64_t{0} : spec.samples * per;
  const std::string size_text = fmt::format("{}{} ({} samples of {})", huge ? "more than " : "",
                                            format_bytes(total), spec.samples, format_bytes(sb));
  {
    // The file is written beside OUT and renamed at the end: a file it replaces (--force)
    // still takes its space until then.
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path dir = fs::absolute(o.out, ec).parent_path();
    const fs::space_info space = fs::space(dir, ec);
    const bool known = !ec;  // no such directory: the writer says so
    const std::string free_text =
        known ? fmt::format("{} free on {}", format_bytes(space.available), dir.string()) : "";
    if (known && (huge || total + (1ULL << 20) > space.available)) {
      exit_code() = usage("gen", fmt::format("--samples: {} would take {}, more than the {}; "
                                             "nothing written",
                                             o.out, size_text, free_text));
      return;
    }
    if (total > kGenConfirmBytes && !o.yes) {
      exit_code() = usage("gen", fmt::format("--samples: {} would take {}, more than {}; pass "
                                             "--yes to write it{}",
                                             o.out, size_text, format_bytes(kGenConfirmBytes),
                                             known ? " (" + free_text + ")" : ""));
      return;
    }
    if (total >= kGenAnnounceBytes)
      fmt::print(stderr, "solar gen: writing {} to {}{}\n", size_text, o.out,
                 known ? " (" + free_text + ")" : "");
  }
  const auto t0 = Clock::now();
  try {
    ProgressBar bar("writing " + o.out, o.progress);
    storage::write_dataset(spec, [&](std::uint64_t d, std::uint64_t t) { bar(d, t); });
  } catch (const StorageError& e) {
    std::fprintf(stderr, "solar gen: %s\n", e.what());
    exit_code() = kExitFailure;
    return;
  }
  const double s = since(t0);
  std::string shape;
  for (auto d : spec.shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
  fmt::print("wrote {}: /data {} samples of {} {} ({} each, {} in all), layout {}, seed {}; "
             "/label int32; {:.1f} s ({:.2f} GB/s)\n",
             o.out, spec.samples, shape, storage::to_string(spec.dtype), format_bytes(sb),
             format_bytes(sb * spec.samples), storage::to_string(spec.layout), spec.seed, s,
             gbps(sb * spec.samples, s));
}

// ---------------------------------------------------------------------------- sources

struct SourceFlags {
  unsigned threads = 4;
  unsigned queue_depth = 16;
  double timeout = 30;
  std::string provider;

  void add(CLI::App* app) {
    app->add_option("--threads", threads, "Parallel reads for files, 1..256 [4]")
        ->type_name(kUint)
        ->check(CLI::Range(1, 256).description(""));
    app->add_option("--queue-depth", queue_depth, "fabric:// reads in flight, 1..1024 [16]")
        ->type_name(kUint)
        ->check(CLI::Range(1, 1024).description(""));
    app->add_option("--timeout", timeout,
                    "fabric://: seconds without progress before a read is retried [30]")
        ->type_name(kFloat)
        ->check([](const std::string& text) -> std::string {
          try {
            std::size_t used = 0;
            if (std::stod(text, &used) > 0 && used == text.size()) return "";
          } catch (const std::exception&) {
          }
          return "'" + text + "' is not a number of seconds > 0";
        });
    app->add_option("--provider", provider,
                    "fabric://: libfabric provider (default: the server's)")
        ->type_name("NAME");
  }
  std::unique_ptr<storage::SampleSource> open(const std::string& spec) const {
    storage::SourceOptions so;
    so.io_threads = threads;
    so.queue_depth = queue_depth;
    so.timeout_s = timeout;
    so.provider = provider;
    return storage::open_source(spec, so);
  }
};

// Splits sorted runs into batches of at most `max_bytes` (at least one sample each).
std::vector<std::vector<SampleRun>> batches(const std::vector<SampleRun>& runs,
                                            std::uint64_t sample_bytes, std::uint64_t max_bytes) {
  const std::uint64_t per = std::max<std::uint64_t>(1, max_bytes / std::max<std::uint64_t>(1, sample_bytes));
  std::vector<std::vector<SampleRun>> out(1);
  std::uint64_t n = 0;
  for (SampleRun r : runs) {
    while (r.count) {
      if (n == per) {
        out.emplace_back();
        n = 0;
      }
      const std::uint64_t take = std::min(r.count, per - n);
      out.back().push_back({r.first, take});
      r.first += take;
      r.count -= take;
      n += take;
    }
  }
  if (out.back().empty()) out.pop_back();
  return out;
}

// Memory a benchmark's reads land in: page-aligned, as the agent's buffer is (its slots are
// 64-byte aligned), and touched when made, so that page faults of fresh memory are not
// counted as reads. Not a std::vector: its data sits 16 bytes into a page, and copies into
// memory so placed ran slower here (process_vm_readv of 256 KiB pieces, shm's path: 4.5
// against 5.4 GB/s into page-aligned memory, and 5.3-5.7 at offsets 64 and 2048).
class Destination {
 public:
  explicit Destination(std::uint64_t bytes) : bytes_(bytes) {
    void* p = nullptr;
    if (::posix_memalign(&p, 4096, std::max<std::uint64_t>(bytes, 1)) != 0) throw std::bad_alloc();
    p_.reset(static_cast<std::byte*>(p));
    std::memset(p, 1, bytes);
  }
  std::byte* data() const { return p_.get(); }
  std::span<std::byte> span() const { return {p_.get(), bytes_}; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> p_;
  std::uint64_t bytes_;
};

// Reads every batch, two at a time (double buffering: one batch is being issued while the
// other completes, as the agent does), into `bufs`, two buffers of at least a batch each.
void read_all(storage::SampleSource& src, const std::vector<std::vector<SampleRun>>& parts,
              const Destination (&bufs)[2]) {
  std::atomic<std::size_t> next{0};
  std::exception_ptr err;
  std::mutex mu;
  auto reader = [&](const Destination& buf) {
    try {
      for (std::size_t i; (i = next.fetch_add(1)) < parts.size();) src.read(parts[i], buf.data());
    } catch (...) {
      std::lock_guard g(mu);
      if (!err) err = std::current_exception();
      next = parts.size();
    }
  };
  std::thread other(reader, std::cref(bufs[1]));
  reader(bufs[0]);
  other.join();
  if (err) std::rethrow_exception(err);
}

// ---------------------------------------------------------------------------- verify

struct VerifyOptions {
  std::string source;
  std::optional<std::string> range;
  std::optional<std::uint64_t> sample;
  std::optional<std::uint64_t> seed;
  std::string batch = "64M";
  bool progress = true;
  bool json = false;
  SourceFlags flags;
};

void run_verify(const VerifyOptions& o) {
  std::unique_ptr<storage::SampleSource> src;
  std::uint64_t batch_bytes = 0;
  std::vector<SampleRun> runs;
  std::uint64_t seed = 0;
  try {
    batch_bytes = parse_bytes(o.batch, "--batch-bytes");
    if (batch_bytes == 0) throw ConfigError("--batch-bytes", "must be > 0");
    if (o.range && o.sample) throw ConfigError("--sample", "give --range or --sample, not both");
    try {
      src = o.flags.open(o.source);
    } catch (const StorageError& e) {
      throw ConfigError("SOURCE", e.what());
    }
    const auto& info = src->info();
    if (o.seed) seed = *o.seed;
    else if (info.seed) seed = *info.seed;
    else
      throw ConfigError("--seed", fmt::format("{} carries no solar_seed attribute (not written by "
                                              "`solar gen`?); pass the seed it was written with",
                                              src->describe()));
    std::uint64_t first = 0, last = info.samples;
    if (o.range) {
      const auto colon = o.range->find(':');
      try {
        if (colon == std::string::npos) throw std::invalid_argument("");
        std::size_t used = 0;
        const std::string a = o.range->substr(0, colon), b = o.range->substr(colon + 1);
        if (!a.empty()) first = std::stoull(a, &used);
        if (!a.empty() && used != a.size()) throw std::invalid_argument("");
        if (!b.empty()) last = std::stoull(b, &used);
        if (!b.empty() && used != b.size()) throw std::invalid_argument("");
      } catch (const std::exception&) {
        throw ConfigError("--range", fmt::format("'{}' is not FIRST:END (e.g. 0:100)", *o.range));
      }
      if (first >= last || last > info.samples)
        throw ConfigError("--range", fmt::format("{}:{} is outside the dataset's samples 0:{}",
                                                 first, last, info.samples));
    }
    if (o.sample) {
      if (*o.sample == 0 || *o.sample > info.samples)
        throw ConfigError("--sample", fmt::format("must be in 1..{}", info.samples));
      std::vector<std::uint32_t> perm(info.samples);
      solar_permutation(seed + 1, 0, perm);
      runs = storage::coalesce({perm.begin(), perm.begin() + static_cast<std::ptrdiff_t>(*o.sample)});
    } else if (info.samples) {
      runs = {{first, last - first}};
    }
  } catch (const ConfigError& e) {
    exit_code() = usage("verify", e.what());
    return;
  }
  const auto& info = src->info();
  const std::uint64_t sb = info.sample_bytes;
  const bool check_labels = info.has_labels && info.label_dtype == storage::DType::int32 &&
                            info.label_bytes == 4;
  const auto parts = batches(runs, sb, batch_bytes);
  std::vector<std::byte> buf(std::min(batch_bytes, storage::total_samples(runs) * sb) + sb);
  std::vector<std::int32_t> labels;
  std::vector<std::uint64_t> bad, bad_labels;
  std::uint64_t checked = 0;
  const std::uint64_t total = storage::total_samples(runs);
  double read_s = 0;
  const auto t0 = Clock::now();
  try {
    ProgressBar bar("verifying", o.progress && !o.json);
    for (const auto& part : parts) {
      const std::uint64_t n = storage::total_samples(part);
      const auto tr = Clock::now();
      src->read(part, buf.data());
      read_s += since(tr);
      if (check_labels) {
        labels.resize(n);
        src->read_labels(part, reinterpret_cast<std::byte*>(labels.data()));
      }
      std::vector<std::uint64_t> ids;
      for (const auto& r : part)
        for (std::uint64_t i = 0; i < r.count; ++i) ids.push_back(r.first + i);
      std::vector<char> ok(n, 1);
      std::atomic<std::size_t> next{0};
      auto work = [&] {
        for (std::size_t i; (i = next.fetch_add(1)) < n;)
          ok[i] = storage::content::check_sample(seed, ids[i], buf.data() + i * sb, sb);
      };
      std::thread helper(work);
      work();
      helper.join();
      for (std::uint64_t i = 0; i < n; ++i) {
        if (!ok[i]) bad.push_back(ids[i]);
        if (check_labels && labels[i] != storage::content::label(seed, ids[i]))
          bad_labels.push_back(ids[i]);
      }
      checked += n;
      bar(checked, total);
    }
  } catch (const StorageError& e) {
    std::fprintf(stderr, "solar verify: %s\n", e.what());
    exit_code() = kExitFailure;
    return;
  }
  const double s = since(t0);
  const std::uint64_t bytes = checked * sb;
  const bool all_ok = bad.empty() && bad_labels.empty();
  if (o.json) {
    fmt::print("{}\n", nlohmann::json{{"source", src->describe()},
                                      {"samples", checked},
                                      {"bytes", bytes},
                                      {"bad_samples", bad},
                                      {"bad_labels", bad_labels},
                                      {"labels_checked", check_labels},
                                      {"seconds", s},
                                      {"read_gbps", gbps(bytes, read_s)},
                                      {"ok", all_ok}}
                           .dump(2));
  } else {
    fmt::print("{}: {} {} samples of {} {} ({}){}, seed {}\n", src->describe(),
               all_ok ? "verified" : "checked", checked, info.shape_string(),
               storage::to_string(info.dtype), format_bytes(bytes),
               check_labels ? " and their labels" : "", seed);
    fmt::print("read {:.2f} GB/s, overall {:.2f} GB/s ({:.2f} s)\n", gbps(bytes, read_s),
               gbps(bytes, s), s);
    auto list = [](const std::vector<std::uint64_t>& v) {
      std::string out;
      for (std::size_t i = 0; i < std::min<std::size_t>(v.size(), 10); ++i)
        out += (i ? ", " : "") + std::to_string(v[i]);
      return out + (v.size() > 10 ? ", ..." : "");
    };
    if (!bad.empty())
      fmt::print("MISMATCH: {} sample(s) differ from the generator: {}\n", bad.size(), list(bad));
    if (!bad_labels.empty())
      fmt::print("MISMATCH: {} label(s) differ: {}\n", bad_labels.size(), list(bad_labels));
    if (all_ok) fmt::print("all match\n");
  }
  exit_code() = all_ok ? kExitOk : kExitFailure;
}

// ---------------------------------------------------------------------------- bench io

struct BenchOptions {
  std::string source;
  double fraction = 0.5;
  unsigned workers = 8;
  std::string batch = "64M";
  std::uint64_t seed = 0;
  bool cold = true;
  bool json = false;
  bool reference = true;  // fabric://: the raw fabric beside each phase
  std::string reference_op = "4M";
  std::string reference_memory = "plain";  // plain | export
  unsigned repeat = 1;
  SourceFlags flags;
};

// fi_reads of `bytes` at `offset`, in pieces of at most `op` bytes.
void add_reads(std::vector<storage::FabricRead>& out, std::uint64_t offset, std::uint64_t bytes,
               std::uint64_t op) {
  for (std::uint64_t done = 0; done < bytes; done += op)
    out.push_back({offset + done, std::min(op, bytes - done)});
}

void run_bench_io(const BenchOptions& o) {
  std::unique_ptr<storage::SampleSource> src;
  std::uint64_t batch_bytes = 0, reference_op = 0;
  try {
    batch_bytes = parse_bytes(o.batch, "--batch-bytes");
    if (batch_bytes == 0) throw ConfigError("--batch-bytes", "must be > 0");
    reference_op = parse_bytes(o.reference_op, "--reference-op");
    if (reference_op == 0) throw ConfigError("--reference-op", "must be > 0");
    if (!(o.fraction > 0 && o.fraction <= 1))
      throw ConfigError("--fraction", "must be in (0, 1]");
    try {
      src = o.flags.open(o.source);
    } catch (const StorageError& e) {
      throw ConfigError("SOURCE", e.what());
    }
    if (src->info().samples == 0) throw ConfigError("SOURCE", "the dataset has no samples");
  } catch (const ConfigError& e) {
    exit_code() = usage("bench io", e.what());
    return;
  }
  const auto& info = src->info();
  const std::uint64_t sb = info.sample_bytes;
  const std::uint64_t k = std::max<std::uint64_t>(
      1, static_cast<std::uint64_t>(o.fraction * static_cast<double>(info.samples)));
  std::vector<std::uint32_t> perm(info.samples);
  solar_permutation(o.seed, 0, perm);
  std::vector<std::uint64_t> ids(perm.begin(), perm.begin() + static_cast<std::ptrdiff_t>(k));
  const auto sorted_runs = storage::coalesce(ids);
  const std::uint64_t bytes = k * sb;
  const std::uint64_t per_batch = std::min(batch_bytes, bytes);
  auto* served = dynamic_cast<storage::FabricSource*>(src.get());
  auto* fabric = o.reference ? served : nullptr;
  // The raw fabric's reference: the same server, provider and bytes in plain fi_reads of the
  // phase's request sizes (one sample each; runs and the sequential range in reads of at most
  // --reference-op), --queue-depth in flight, from the server's plain memory (as large as the
  // dataset, up to kMaxReferenceBytes) into the phase's own destination (see below).
  const std::uint64_t remote_bytes =
      std::min<std::uint64_t>(info.samples * sb, storage::kMaxReferenceBytes);
  const unsigned window = o.flags.queue_depth;
  const auto reference_memory = o.reference_memory == "export"
                                    ? storage::ReferenceMemory::exported
                                    : storage::ReferenceMemory::plain;

  struct Phase {
    std::string name;
    std::uint64_t requests = 0;
    std::function<void()> run;
    std::vector<storage::FabricRead> reference_reads;
    std::span<std::byte> reference_local;  // where the reference's reads land
    std::vector<double> seconds, reference_seconds;
    std::optional<storage::FabricReference> reference;
  };
  std::vector<Phase> phases(3);
  // The destinations, allocated and touched before anything is timed: for one-sample requests
  // a ring of max(--queue-depth, --workers) samples (not one cache-hot sample per worker), and
  // two batch buffers for the coalesced and sequential phases, page-aligned (Destination). The
  // reference's reads land in the same memory (the ring, the first batch buffer): on this VM
  // solar's shm 256 KiB reads into a buffer allocated for the run took 4.7-5.6 GB/s, into the
  // ring (then a std::vector, 16 bytes into a page) 3.4-3.6 (measure_fabric in
  // fabric_source.h).
  const std::uint64_t ring_slots = std::max<std::uint64_t>(window, o.workers);
  const Destination ring(ring_slots * sb);
  const Destination batch_bufs[2] = {Destination(per_batch + sb), Destination(per_batch + sb)};
  // 1. One sample per request, random order, from `workers` threads (a PyTorch Dataset's
  //    __getitem__ under a DataLoader with that many workers).
  phases[0].name = "random, 1 sample/request";
  phases[0].requests = k;
  phases[0].run = [&] {
    std::atomic<std::uint64_t> next{0};
    std::exception_ptr err;
    std::mutex mu;
    std::vector<std::thread> ts;
    for (unsigned w = 0; w < o.workers; ++w)
      ts.emplace_back([&] {
        try {
          for (std::uint64_t i; (i = next.fetch_add(1)) < k;) {
            const SampleRun r{ids[i], 1};
            src->read({&r, 1}, ring.data() + (i % ring_slots) * sb);
          }
        } catch (...) {
          std::lock_guard g(mu);
          if (!err) err = std::current_exception();
          next = k;
        }
      });
    for (auto& t : ts) t.join();
    if (err) std::rethrow_exception(err);
  };
  for (std::uint64_t id : ids) phases[0].reference_reads.push_back({id * sb, sb});
  phases[0].reference_local = ring.span();
  // 2. The same samples, sorted and coalesced into runs, read batch by batch.
  const auto coalesced_parts = batches(sorted_runs, sb, batch_bytes);
  phases[1].name = "sorted, coalesced runs";
  phases[1].requests = sorted_runs.size();
  phases[1].run = [&] { read_all(*src, coalesced_parts, batch_bufs); };
  for (const auto& r : sorted_runs)
    add_reads(phases[1].reference_reads, r.first * sb, r.count * sb, reference_op);
  phases[1].reference_local = batch_bufs[0].span();
  // 3. Device limit: the same number of bytes, read sequentially from sample 0.
  const auto seq_parts = batches({{0, k}}, sb, batch_bytes);
  phases[2].name = "sequential (device limit)";
  phases[2].requests = seq_parts.size();
  phases[2].run = [&] { read_all(*src, seq_parts, batch_bufs); };
  add_reads(phases[2].reference_reads, 0, bytes, reference_op);
  phases[2].reference_local = batch_bufs[0].span();

  try {
    for (auto& p : phases)
      for (unsigned rep = 0; rep < o.repeat; ++rep) {
        auto reference = [&] {
          if (!fabric) return;
          p.reference = fabric->measure_fabric(p.reference_reads, window, p.reference_local,
                                               remote_bytes, reference_memory);
          p.reference_seconds.push_back(p.reference->seconds);
        };
        // Every other run measures the reference first: neither side always runs on what
        // the other left behind (a warmed connection, the caches, the scheduler's state).
        if (rep % 2) reference();
        if (o.cold) src->drop_cache();
        const auto t0 = Clock::now();
        p.run();
        p.seconds.push_back(since(t0));
        if (rep % 2 == 0) reference();
      }
  } catch (const StorageError& e) {
    std::fprintf(stderr, "solar bench io: %s\n", e.what());
    exit_code() = kExitFailure;
    return;
  }
  const double seq = gbps(bytes, median(phases[2].seconds));
  auto fabric_gbps = [&](const Phase& p) { return gbps(bytes, median(p.reference_seconds)); };
  // solar's reads as a share of the fabric's: per run, against the reference measured beside
  // it (the same bytes, so reference seconds / solar seconds), then the median and the range of
  // those ratios. Paired this way, what a shared machine's load does to both sides of one run
  // cancels out, which a ratio of two medians taken from different runs does not do.
  auto vs_fabric_runs = [&](const Phase& p) {
    std::vector<double> r;
    for (std::size_t i = 0; i < p.seconds.size() && i < p.reference_seconds.size(); ++i)
      r.push_back(p.seconds[i] > 0 ? p.reference_seconds[i] / p.seconds[i] : 0);
    return r;
  };
  auto vs_fabric = [&](const Phase& p) { return median(vs_fabric_runs(p)); };
  if (o.json) {
    nlohmann::json j = {{"source", src->describe()},   {"layout", info.layout},
                        {"sample_bytes", sb},          {"samples_read", k},
                        {"bytes_per_phase", bytes},    {"cold", o.cold},
                        {"workers", o.workers},        {"repeat", o.repeat},
                        {"phases", nlohmann::json::array()}};
    for (const auto& p : phases) {
      const double s = median(p.seconds);
      nlohmann::json ph = {{"name", p.name},
                           {"requests", p.requests},
                           {"seconds", s},
                           {"seconds_runs", p.seconds},
                           {"gbps", gbps(bytes, s)},
                           {"vs_sequential", seq > 0 ? gbps(bytes, s) / seq : 0}};
      if (p.reference) {
        ph["fabric_gbps"] = fabric_gbps(p);
        ph["vs_fabric"] = vs_fabric(p);
        ph["vs_fabric_runs"] = vs_fabric_runs(p);
        ph["fabric"] = {{"seconds", median(p.reference_seconds)},
                        {"reads", p.reference->reads},
                        {"bytes", p.reference->bytes},
                        {"local_bytes", p.reference->local_bytes},
                        {"seconds_runs", p.reference_seconds}};
      }
      j["phases"].push_back(ph);
    }
    j["coalesced_vs_random"] = median(phases[0].seconds) / median(phases[1].seconds);
    if (fabric) {
      const auto& r = *phases[0].reference;
      j["fabric_reference"] = {{"provider", r.provider},
                               {"window", r.window},
                               {"remote_bytes", r.remote_bytes},
                               {"memory", o.reference_memory},
                               {"max_read_bytes", reference_op}};
    } else {
      j["fabric_reference"] = nullptr;
    }
    if (served) j["server_memory"] = served->served_from();
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("{}: {} samples of {} ({} layout{}); reading a random {:.0f}% = {} samples, {} per "
             "phase, {} cache{}\n\n",
             src->describe(), info.samples, format_bytes(sb), info.layout,
             !served                               ? ""
             : served->served_from() == "memory"   ? ", served from the server's own copy"
             : served->served_from() == "staged"   ? ", staged by the server"
                                                   : ", served from the server's mapped file",
             100 * o.fraction, k, format_bytes(bytes),
             o.cold ? "cold (dropped before each phase)" : "warm",
             o.repeat > 1 ? fmt::format(", median of {} runs", o.repeat) : "");
  fmt::print("{:<28} {:>10} {:>9} {:>9} {:>14}", "phase", "requests", "seconds", "GB/s",
             "vs sequential");
  if (fabric) fmt::print(" {:>12} {:>10}", "fabric GB/s", "vs fabric");
  if (fabric && o.repeat > 1) fmt::print(" {:>15}", "runs' range");
  fmt::print("\n");
  for (const auto& p : phases) {
    const double s = median(p.seconds);
    const double g = gbps(bytes, s);
    fmt::print("{:<28} {:>10} {:>9.2f} {:>9.2f} {:>13.1f}%", p.name, p.requests, s, g,
               seq > 0 ? 100 * g / seq : 0);
    if (fabric) fmt::print(" {:>12.2f} {:>9.1f}%", fabric_gbps(p), 100 * vs_fabric(p));
    if (const auto r = vs_fabric_runs(p); fabric && o.repeat > 1 && !r.empty()) {
      const auto [lo, hi] = std::minmax_element(r.begin(), r.end());
      fmt::print(" {:>15}", fmt::format("{:.0f}-{:.0f}%", 100 * *lo, 100 * *hi));
    }
    fmt::print("\n");
  }
  fmt::print("\ncoalesced vs random: {:.2f}x faster\n",
             median(phases[0].seconds) / median(phases[1].seconds));
  if (fabric) {
    const auto& r = *phases[0].reference;
    const bool from_export = reference_memory == storage::ReferenceMemory::exported;
    fmt::print("fabric: plain fi_reads on an endpoint of their own ({}), {} in flight, of each "
               "phase's sizes (runs in reads of at most {}), from {}: {}\n",
               r.provider, r.window, format_bytes(reference_op),
               from_export
                   ? "the export's own memory (the mapped file, or the server's copy under "
                     "--in-memory, at the offsets solar reads)"
                   : fmt::format("{} of the server's plain memory", format_bytes(r.remote_bytes)),
               from_export ? "solar's read path is not on it, the server's memory is"
                           : "the page cache and solar's read path are not on it");
    if (o.repeat > 1)
      fmt::print("vs fabric: the median over the runs of each run's ratio to the reference "
                 "measured beside it (every other run measures the reference first)\n");
  }
}

}  // namespace

void add_storage_commands(CLI::App& app) {
  auto g = std::make_shared<GenOptions>();
  CLI::App* gen = app.add_subcommand(
      "gen",
      "Write a dataset: /data with N samples (content a deterministic function of seed and\n"
      "index, so `solar verify` can check every byte) and /label (one int32 per sample).\n"
      "Size: N × the sample size (--preset/--shape/--dtype) + 4 bytes a sample. It refuses\n"
      "(exit 2, nothing written) anything larger than the free space where OUT goes, asks\n"
      "for --yes above 10 GiB, and says how much it writes from 1 GiB on.");
  gen->add_option("out", g->out, "The HDF5 file to write (OUT.h5)")->type_name(kFile)->required();
  gen->add_option("--samples", g->samples, "Number of samples N (required)")->type_name(kUint);
  gen->add_option("--preset", g->preset,
                  "Sample shape and dtype: cosmoflow = 4x128x128x128 int16 (16 MiB), small = "
                  "4x32x32x32 int16 (256 KiB), tiny = 4x8x8x8 int16 (4 KiB) [cosmoflow]")
      ->type_name("NAME");
  gen->add_option("--shape", g->shape, "Shape of one sample, e.g. 4,128,128,128 (overrides the preset)")
      ->type_name("UINT,...");
  gen->add_option("--dtype", g->dtype,
                  "int8, uint8, int16, uint16, int32, uint32, int64, uint64, float32, float64 "
                  "(overrides the preset)")
      ->type_name("DTYPE");
  gen->add_option("--layout", g->layout,
                  "contiguous (raw, fastest), chunked (one sample per chunk), gzip (chunked + "
                  "deflate level 1) [contiguous]")
      ->type_name("LAYOUT");
  gen->add_option("--seed", g->seed, "Content seed [0]")->type_name(kUint);
  gen->add_flag("--force", g->force, "Replace OUT if it exists");
  gen->add_flag("-y,--yes", g->yes,
                "Write more than 10 GiB (never more than the free space)");
  gen->add_flag_callback("--no-progress", [g] { g->progress = false; }, "No progress bar");
  gen->callback([g] { run_gen(*g); });

  auto v = std::make_shared<VerifyOptions>();
  CLI::App* verify = app.add_subcommand(
      "verify",
      "Read samples through a source and check every byte (and label) against the generator\n"
      "of `solar gen`. Exit code 0: all match; 1: a mismatch or a read failed; 2: bad input.");
  verify->add_option("source", v->source, "FILE.h5:/dataset (default /data) or fabric://HOST:PORT/NAME")
      ->type_name(kSource)
      ->required();
  verify->add_option("--range", v->range, "Only samples FIRST:END (END exclusive)")
      ->type_name("UINT:UINT");
  verify->add_option("--sample", v->sample, "Only this many samples, chosen at random")
      ->type_name(kUint);
  verify->add_option("--seed", v->seed, "Content seed (default: the file's solar_seed attribute)")
      ->type_name(kUint);
  verify->add_option("--batch-bytes", v->batch, "Bytes read per request batch [64M]")
      ->type_name(kBytes);
  verify->add_flag("--json", v->json, "Print machine-readable results");
  verify->add_flag_callback("--no-progress", [v] { v->progress = false; }, "No progress bar");
  v->flags.add(verify);
  verify->callback([v] { run_verify(*v); });

  // What the SPANK plugin needs from a dataset, read in this separate process so that the
  // plugin itself never loads HDF5, MPI or libfabric into srun or slurmstepd.
  struct InfoOptions {
    std::string source, labels = "/label", provider;
  };
  auto in = std::make_shared<InfoOptions>();
  CLI::App* info = app.add_subcommand(
      "dataset-info",
      "Print a dataset's shape and identity as one JSON line: samples, sample_bytes, "
      "label_bytes (0: no labels), shape, dtype, layout, identity. Exit code 2 with one line "
      "naming the problem when it cannot be read. Used by the Slurm plugin.");
  info->add_option("source", in->source, "FILE.h5:/dataset (default /data) or fabric://HOST:PORT/NAME")
      ->type_name(kSource)
      ->required();
  info->add_option("--labels", in->labels, "Labels dataset ('' for none) [/label]")
      ->type_name("PATH");
  info->add_option("--provider", in->provider, "libfabric provider for fabric:// sources")
      ->type_name("NAME");
  info->callback([in] {
    storage::SourceOptions so;
    so.label_dataset = in->labels;
    so.provider = in->provider;
    try {
      const auto src = storage::open_source(in->source, so);
      const auto& i = src->info();
      fmt::print("{}\n", nlohmann::json{{"samples", i.samples},
                                         {"sample_bytes", i.sample_bytes},
                                         {"label_bytes", i.has_labels ? i.label_bytes : 0},
                                         {"shape", i.shape_string()},
                                         {"dtype", std::string(storage::to_string(i.dtype))},
                                         {"layout", i.layout},
                                         {"identity", src->identity()}}
                                  .dump());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      exit_code() = kExitUsage;
    }
  });

  CLI::App* bench = app.add_subcommand("bench", "Benchmarks.");
  bench->require_subcommand(1);
  auto b = std::make_shared<BenchOptions>();
  CLI::App* io = bench->add_subcommand(
      "io",
      "Measure a source three ways in one run, each over the same number of bytes: random\n"
      "one-sample requests (what a PyTorch Dataset does), the same samples as sorted\n"
      "coalesced runs (what solar does), and a sequential read (the device limit).");
  io->add_option("source", b->source, "FILE.h5:/dataset or fabric://HOST:PORT/NAME")
      ->type_name(kSource)
      ->required();
  io->add_option("--fraction", b->fraction, "Share of the samples to read [0.5]")
      ->type_name(kFloat);
  io->add_option("--workers", b->workers, "Threads issuing one-sample requests, 1..256 [8]")
      ->type_name(kUint)
      ->check(CLI::Range(1, 256).description(""));
  io->add_option("--batch-bytes", b->batch, "Bytes per coalesced/sequential request batch [64M]")
      ->type_name(kBytes);
  io->add_option("--seed", b->seed, "Seed of the random sample choice [0]")->type_name(kUint);
  io->add_flag_callback("--warm", [b] { b->cold = false; },
               "Keep the page cache (default: drop it before each phase: posix_fadvise "
               "DONTNEED for files, the server's cache for fabric://)");
  io->add_flag("--json", b->json, "Print machine-readable results");
  io->add_flag_callback("--no-reference", [b] { b->reference = false; },
                        "fabric://: skip the raw-fabric reference (by default each phase is "
                        "followed by plain fi_reads of the same sizes on an endpoint of their "
                        "own, and solar's reads are given as a share of them)");
  io->add_option("--reference-memory", b->reference_memory,
                 "fabric://: what the reference reads on the server: plain (anonymous memory "
                 "it lends, the fabric's own limit) or export (the export's own memory at the "
                 "offsets solar reads: the mapped file, or the server's copy under "
                 "solar-stored --in-memory; what solar's read path costs, the same memory being "
                 "on both sides) [plain]")
      ->type_name("MEMORY")
      ->check(CLI::IsMember({"plain", "export"}));
  io->add_option("--reference-op", b->reference_op,
                 "fabric://: largest fi_read of the reference; runs and the sequential range "
                 "are read in pieces of this size [4M]")
      ->type_name(kBytes);
  io->add_option("--repeat", b->repeat,
                 "Run each phase (and its reference, alternately before and after it) this many "
                 "times and report the medians (vs fabric: of each run's ratio), "
                 "1..100 [1]")
      ->type_name(kUint)
      ->check(CLI::Range(1, 100).description(""));
  b->flags.add(io);
  io->callback([b] { run_bench_io(*b); });
}

}  // namespace solar::cli

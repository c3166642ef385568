// SPDX-License-Identifier: Apache-2.0
// solar-example-train: iterates every epoch of this rank's plan through libsolar, as a training
// loop would. --verify checks every sample's bytes (and label) against the deterministic
// content `solar gen` wrote; --compute-ms spends that long per batch as if training. Prints
// per-epoch data-loading time in the SOLAR artifact's format.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>
#include <vector>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>

#include <dlfcn.h>

#include "solar/core/plan_file.h"
#include "solar/core/plan_stream.h"
#include "solar/core/plan_stream.h"
#include "solar/solar.hpp"
#include "solar/storage/content.h"
#include "solar/storage/sample_source.h"

namespace {

// --device-copy's own device memory: the CUDA runtime opened when asked for (dlopen), as
// libsolar does, so the program needs no CUDA to build, install or run without a GPU.
struct DeviceMemory {
  int (*Malloc)(void**, std::size_t) = nullptr;
  int (*Free)(void*) = nullptr;
  int (*Memcpy)(void*, const void*, std::size_t, int) = nullptr;  // 2 = device to host
  int (*DeviceSynchronize)() = nullptr;
  void* ptr = nullptr;
  std::size_t bytes = 0;

  DeviceMemory() {
    void* h = nullptr;
    const char* env = std::getenv("SOLAR_CUDART");
    // The runtime libsolar already opened first: one CUDA runtime in the process.
    for (int flags : {RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL})
      for (const char* n : {env ? env : "", "libcudart.so", "libcudart.so.13", "libcudart.so.12",
                            "libcudart.so.11.0"})
        if (!h && *n) h = ::dlopen(n, flags);
    if (!h) throw solar::Error("--device-copy: cannot open libcudart (set SOLAR_CUDART)");
    Malloc = reinterpret_cast<decltype(Malloc)>(::dlsym(h, "cudaMalloc"));
    Free = reinterpret_cast<decltype(Free)>(::dlsym(h, "cudaFree"));
    Memcpy = reinterpret_cast<decltype(Memcpy)>(::dlsym(h, "cudaMemcpy"));
    DeviceSynchronize = reinterpret_cast<decltype(DeviceSynchronize)>(::dlsym(h, "cudaDeviceSynchronize"));
    if (!Malloc || !Free || !Memcpy || !DeviceSynchronize)
      throw solar::Error("--device-copy: libcudart lacks cudaMalloc/cudaFree/cudaMemcpy");
  }
  ~DeviceMemory() {
    if (ptr) Free(ptr);
  }
  void* at_least(std::size_t n) {
    if (n > bytes) {
      if (ptr) Free(ptr);
      ptr = nullptr;
      if (Malloc(&ptr, n) != 0) throw solar::Error("--device-copy: cudaMalloc failed");
      bytes = n;
    }
    return ptr;
  }
  // Copies device memory back (after the default stream's work) for comparison.
  void read_back(std::vector<std::byte>& out) const {
    if (DeviceSynchronize() != 0 || Memcpy(out.data(), ptr, out.size(), 2) != 0)
      throw solar::Error("--device-copy: cudaMemcpy back failed");
  }
};

// The baseline the benchmarks compare with: what a PyTorch Dataset + DataLoader does. This
// rank's batches (from the same plan file) are read directly from storage, one request per
// sample, by K reader threads that work ahead up to two batches (DataLoader's prefetch).
class BaselineReader {
 public:
  struct Batch {
    std::uint64_t step = 0;
    std::vector<std::uint32_t> samples;
    std::vector<std::byte> data, labels;
    std::size_t done = 0;
  };

  BaselineReader(unsigned readers, const std::string& labels, bool direct) {
    const solar::PlanFile pf = solar::PlanFile::open(need("SOLAR_PLAN"));
    header_ = pf.header();
    node_ = static_cast<std::uint32_t>(std::stoul(need("SOLAR_NODE")));
    local_ = static_cast<std::uint32_t>(std::stoul(need("SOLAR_LOCAL_RANK")));
    plan_ = solar::node_plan(pf, node_);
    R_ = header_.config.ranks_per_node;
    T_ = std::uint64_t{header_.layout.steps} * header_.config.epochs;
    solar::storage::SourceOptions so;
    so.label_dataset = labels;
    so.io_threads = 1;
    so.direct = direct;  // no page cache: every epoch comes from storage
    src_ = solar::storage::open_source(need("SOLAR_DATASET"), so);
    sample_bytes_ = src_->info().sample_bytes;
    label_bytes_ = src_->info().has_labels ? src_->info().label_bytes : 0;
    for (unsigned i = 0; i < readers; ++i) threads_.emplace_back([this] { work(); });
  }
  ~BaselineReader() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  std::uint32_t rank() const { return node_ * R_ + local_; }
  std::uint32_t epochs() const { return header_.config.epochs; }
  std::uint32_t steps_per_epoch() const { return header_.layout.steps; }
  std::uint64_t sample_bytes() const { return sample_bytes_; }
  std::uint64_t label_bytes() const { return label_bytes_; }

  // The next batch in plan order, once all its samples are read; nullptr at the end.
  std::unique_ptr<Batch> next() {
    std::unique_lock lk(mu_);
    if (taken_ >= T_) return nullptr;
    while (queued_ < std::min(T_, taken_ + 2)) enqueue_locked();
    cv_.notify_all();
    done_cv_.wait(lk, [&] { return error_.size() || ready_.front()->done == ready_.front()->samples.size(); });
    if (!error_.empty()) throw std::runtime_error(error_);
    auto b = std::move(ready_.front());
    ready_.pop_front();
    ++taken_;
    while (queued_ < std::min(T_, taken_ + 2)) enqueue_locked();
    cv_.notify_all();
    return b;
  }

 private:
  static std::string need(const char* name) {
    const char* v = std::getenv(name);
    if (!v) throw std::runtime_error(std::string(name) + " is not set: run under solar run");
    return v;
  }
  void enqueue_locked() {
    auto b = std::make_unique<Batch>();
    b->step = queued_;
    const std::uint64_t i = queued_ * R_ + local_;
    for (std::uint64_t k = plan_.rank_offsets[i]; k < plan_.rank_offsets[i + 1]; ++k)
      b->samples.push_back(plan_.accesses[k] & solar::kSampleMask);
    b->data.resize(b->samples.size() * sample_bytes_);
    b->labels.resize(b->samples.size() * label_bytes_);
    for (std::size_t k = 0; k < b->samples.size(); ++k) work_.push_back({b.get(), k});
    ready_.push_back(std::move(b));
    ++queued_;
  }
  void work() {
    for (;;) {
      std::pair<Batch*, std::size_t> job;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !work_.empty(); });
        if (stop_) return;
        job = work_.front();
        work_.pop_front();
      }
      auto [b, k] = job;
      try {
        const solar::storage::SampleRun run{b->samples[k], 1};
        src_->read({&run, 1}, b->data.data() + k * sample_bytes_);
        if (label_bytes_) src_->read_labels({&run, 1}, b->labels.data() + k * label_bytes_);
      } catch (const std::exception& e) {
        std::lock_guard lk(mu_);
        error_ = e.what();
      }
      {
        std::lock_guard lk(mu_);
        ++b->done;
      }
      done_cv_.notify_all();
    }
  }

  solar::PlanHeader header_;
  solar::NodePlan plan_;
  std::uint32_t node_ = 0, local_ = 0, R_ = 1;
  std::uint64_t T_ = 0, sample_bytes_ = 0, label_bytes_ = 0;
  std::unique_ptr<solar::storage::SampleSource> src_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::pair<Batch*, std::size_t>> work_;
  std::deque<std::unique_ptr<Batch>> ready_;
  std::uint64_t queued_ = 0, taken_ = 0;
  bool stop_ = false;
  std::string error_;
  std::vector<std::thread> threads_;
};

}  // namespace

int main(int argc, char** argv) {
  bool verify = false, quiet = false, touch = false, device_copy = false, direct_io = false;
  double compute_ms = 0;
  unsigned baseline = 0;
  std::uint64_t max_batches = 0;
  const auto started = std::chrono::steady_clock::now();
  std::string record, report;
  CLI::App app{"solar-example-train: a rank program that reads its batches through libsolar.\n"
               "Run it under `solar run` or `srun --solar-*` (it reads SOLAR_* variables).",
               "solar-example-train"};
  app.set_version_flag("--version", "solar-example-train " SOLAR_PROJECT_VERSION);
  app.add_flag("--verify", verify, "Check every sample's content (datasets made by solar gen)");
  app.add_option("--compute-ms", compute_ms, "Milliseconds of compute per batch [0]");
  app.add_option("--batches", max_batches,
                 "Stop after this many batches (0: all of them); with --report, the time from "
                 "this program's start to its first batch is measured either way [0]");
  app.add_option("--record", record, "Write each step's samples to this file (%r: the rank)");
  app.add_flag("--quiet", quiet, "Print nothing but errors (use --report)");
  app.add_option("--baseline", baseline,
                 "Do not use libsolar: read this rank's samples directly, one request per "
                 "sample, with this many reader threads (what a PyTorch DataLoader does)");
  app.add_flag("--direct-io", direct_io,
               "With --baseline: read with O_DIRECT, so every epoch comes from storage (as from "
               "a shared file system whose data does not fit a node's page cache)");
  app.add_flag("--touch", touch,
               "Copy every sample out of its batch (as into a training tensor) and time it "
               "against a private memcpy of the same samples in the same order, done after the "
               "last batch (reported with --report)");
  app.add_flag("--device-copy", device_copy,
               "Copy every batch to the GPU (solar_batch_copy_to_device) and check the first "
               "sample came back intact; without a GPU, say why once and go on");
  app.add_option("--report", report, "Write per-epoch loading times as JSON here (%r: rank)");
  CLI11_PARSE(app, argc, argv);

  try {
    std::unique_ptr<solar::Loader> loader;
    std::unique_ptr<BaselineReader> direct;
    const std::string labels = std::getenv("SOLAR_LABELS") ? std::getenv("SOLAR_LABELS") : "/label";
    if (baseline) direct = std::make_unique<BaselineReader>(baseline, labels, direct_io);
    else loader = std::make_unique<solar::Loader>();
    const std::uint32_t rank = loader ? loader->rank() : direct->rank();
    const std::uint32_t epochs = loader ? loader->epochs() : direct->epochs();
    const std::uint64_t label_bytes = loader ? loader->label_bytes() : direct->label_bytes();
    std::uint64_t seed = 0;
    solar::storage::Content content = solar::storage::Content::random;
    solar::storage::DType label_dtype = solar::storage::DType::int32;
    if (verify) {
      // The content seed is stored with the dataset (solar gen writes it).
      solar::storage::SourceOptions so;
      so.label_dataset = labels;
      so.wait_for_server = true;  // a solar-stored restarting as the rank starts
      auto src = solar::storage::open_source(std::getenv("SOLAR_DATASET"), so);
      if (!src->info().seed)
        throw solar::Error(fmt::format("--verify: {} was not written by solar gen (no seed)",
                                       src->describe()));
      seed = *src->info().seed;
      content = src->info().content;
      label_dtype = src->info().label_dtype;
    }
    auto per_rank = [&](std::string path) {
      if (const auto at = path.find("%r"); at != std::string::npos)
        path.replace(at, 2, std::to_string(rank));
      return path;
    };
    std::ofstream rec;
    if (!record.empty()) {
      rec.open(per_rank(record));
      if (!rec) throw solar::Error("--record: cannot write " + per_rank(record));
    }
    std::vector<double> load_s(epochs, 0.0);
    std::vector<std::uint64_t> epoch_samples(epochs, 0);
    std::uint64_t samples = 0, bad = 0, batches = 0;
    double max_load_s = 0;  // the longest single wait for a batch (--report)
    // --touch: the hit path's bandwidth against memcpy's on the same access pattern: the same
    // samples copied out of a private mirror of the dataset (faulted in up front), after the
    // last batch (during the epochs, on a small node, those copies would take the cores the
    // agent serves from). The first epoch is left out of both (it also measures the buffer's
    // first page faults).
    std::vector<std::byte> tensor, mirror;
    std::vector<std::uint64_t> touched_index;  // the samples touched, in order
    std::vector<std::size_t> touched_batch;    // their batch sizes
    if (touch) {
      const std::uint64_t n = loader ? solar_dataset_samples(loader->get()) : 0;
      const std::uint64_t sb = loader ? loader->sample_bytes() : 0;
      if (n * sb > (1ULL << 30)) throw solar::Error("--touch: dataset over 1 GiB");
      mirror.assign(n * sb, std::byte{1});
    }
    std::vector<std::byte> gathered, gathered_labels;  // --verify: solar_batch_gather's copy
    double touch_s = 0, memcpy_s = 0;
    std::uint64_t touched = 0;
    // One batch, whichever path it came from: check it, record it, "train" on it.
    auto consume = [&](std::uint64_t step, std::size_t n, auto&& index, auto&& data,
                       auto&& label, std::uint64_t bytes) {
      if (touch && !mirror.empty() && step >= (loader ? loader->steps_per_epoch() : 0)) {
        using C = std::chrono::steady_clock;
        tensor.resize(n * bytes);
        auto t0 = C::now();
        for (std::size_t i = 0; i < n; ++i)
          std::memcpy(tensor.data() + i * bytes, data(i), bytes);
        touch_s += std::chrono::duration<double>(C::now() - t0).count();
        for (std::size_t i = 0; i < n; ++i) touched_index.push_back(index(i));
        touched_batch.push_back(n);
        touched += n * bytes;
      }
      if (rec) rec << step;
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint64_t idx = index(i);
        if (rec) rec << ' ' << idx;
        if (!verify) continue;
        bool ok = solar::storage::content::check_sample(seed, idx, data(i), bytes, content);
        if (ok && label_bytes)  // of any dtype and size: content.h's fill_label
          ok = solar::storage::content::check_label(
              seed, idx, label_dtype, static_cast<const std::byte*>(label(i)), label_bytes);
        if (!ok && bad++ < 5)
          std::fprintf(stderr, "rank %u: sample %llu at step %llu has wrong content\n", rank,
                       static_cast<unsigned long long>(idx), static_cast<unsigned long long>(step));
      }
      if (rec) rec << std::endl;  // flushed: tests watch progress through it
      samples += n;
      ++batches;
      if (compute_ms > 0)
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(compute_ms));
    };
    // --device-copy: the GPU path, or the reason there is none.
    bool gpu = false;
    std::optional<DeviceMemory> device;
    std::vector<std::byte> back;
    std::uint64_t gpu_batches = 0, gpu_bad = 0;
    if (device_copy && loader) {
      gpu = solar_cuda_available() != 0;
      if (!gpu) std::printf("rank %u: GPU copies skipped: %s\n", rank, solar_last_error());
      else device.emplace();
    }
    using Clock = std::chrono::steady_clock;
    double first_batch_s = -1;  // this program's start to its first batch (--report)
    for (;;) {
      if (batches == 1 && first_batch_s < 0)
        first_batch_s = std::chrono::duration<double>(Clock::now() - started).count();
      if (max_batches && batches >= max_batches) break;
      const auto t0 = Clock::now();
      if (loader) {
        auto b = loader->next();
        if (!b) break;
        if (device_copy && !gpu) {
          // Must fail cleanly and leave the batch usable.
          if (solar_batch_copy_to_device(b->raw(), nullptr, nullptr) == 0) ++gpu_bad;
        }
        if (gpu) {  // the whole batch to the device and back: every byte compared
          const std::size_t sb = loader->sample_bytes();
          void* dst = device->at_least(std::max<std::size_t>(b->size() * sb, 1));
          if (solar_batch_copy_to_device(b->raw(), dst, nullptr) != 0)
            throw solar::Error(std::string("--device-copy: ") + solar_last_error());
          back.resize(b->size() * sb);
          device->read_back(back);
          for (std::size_t i = 0; i < b->size(); ++i)
            if (std::memcmp(back.data() + i * sb, b->sample(i).data(), sb) != 0) ++gpu_bad;
          ++gpu_batches;
        }
        const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
        load_s[b->epoch()] += waited;
        max_load_s = std::max(max_load_s, waited);
        epoch_samples[b->epoch()] += b->size();
        if (verify) {  // the one-call copy (solar_batch_gather) gives the very same bytes
          const std::uint64_t sb = loader->sample_bytes(), lb = loader->label_bytes();
          gathered.resize(b->size() * sb);
          gathered_labels.resize(b->size() * lb);
          b->gather(gathered, gathered_labels);
          for (std::size_t i = 0; i < b->size(); ++i)
            if (std::memcmp(gathered.data() + i * sb, b->sample(i).data(), sb) != 0 ||
                (lb && std::memcmp(gathered_labels.data() + i * lb, b->label(i), lb) != 0)) {
              if (bad++ < 5)
                std::fprintf(stderr, "rank %u: solar_batch_gather differs at sample %zu of step "
                             "%llu\n", rank, i, static_cast<unsigned long long>(b->step()));
            }
        }
        consume(
            b->step(), b->size(), [&](std::size_t i) { return b->index(i); },
            [&](std::size_t i) { return b->sample(i).data(); },
            [&](std::size_t i) { return b->label(i); }, loader->sample_bytes());
        b->release();
      } else {
        auto b = direct->next();
        if (!b) break;
        const std::uint64_t sb = direct->sample_bytes();
        const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
        load_s[b->step / direct->steps_per_epoch()] += waited;
        max_load_s = std::max(max_load_s, waited);
        epoch_samples[b->step / direct->steps_per_epoch()] += b->samples.size();
        consume(
            b->step, b->samples.size(), [&](std::size_t i) { return b->samples[i]; },
            [&](std::size_t i) { return b->data.data() + i * sb; },
            [&](std::size_t i) { return b->labels.data() + i * label_bytes; }, sb);
      }
    }
    device.reset();
    if (!touched_batch.empty()) {  // --touch: the same copies from the private mirror
      const std::uint64_t bytes = loader->sample_bytes();
      // As large as the largest batch (the last one of an epoch may have been smaller).
      tensor.resize(*std::max_element(touched_batch.begin(), touched_batch.end()) * bytes);
      const auto t0 = std::chrono::steady_clock::now();
      std::size_t k = 0;
      for (const std::size_t n : touched_batch)
        for (std::size_t i = 0; i < n; ++i, ++k)
          std::memcpy(tensor.data() + i * bytes, mirror.data() + touched_index[k] * bytes, bytes);
      memcpy_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (gpu) std::printf("rank %u: %llu batches copied to the GPU, %llu wrong\n", rank,
                         static_cast<unsigned long long>(gpu_batches),
                         static_cast<unsigned long long>(gpu_bad));
    bad += gpu_bad;
    const char* who = baseline ? "baseline" : "SOLAR";
    if (!quiet)
      std::printf("%sDataLoading time %s each epoch: [%s]\n",
                  rank == 0 ? "" : fmt::format("rank {}: ", rank).c_str(), who,
                  fmt::format("{:.4f}", fmt::join(load_s, ", ")).c_str());
    if (!quiet || bad)
      std::printf("rank %u: %llu batches, %llu samples%s%s, %s\n", rank,
                  static_cast<unsigned long long>(batches),
                  static_cast<unsigned long long>(samples), verify ? ", verified" : "",
                  verify ? fmt::format(" ({} wrong)", bad).c_str() : "",
                  baseline ? "read directly, one request per sample"
                           : (loader->using_agent() ? "from the node agent" : "read directly"));
    if (!report.empty()) {
      std::ofstream f(per_rank(report));
      f << nlohmann::json{{"rank", rank},           {"load_seconds", load_s},
                          {"samples", samples},     {"epoch_samples", epoch_samples},
                          {"wrong", bad},           {"touched_bytes", touched},
                          {"touch_seconds", touch_s}, {"memcpy_seconds", memcpy_s},
                          {"first_batch_seconds", first_batch_s},
                          {"batches", batches},     {"max_load_seconds", max_load_s}}
               .dump()
        << "\n";
    }
    return bad ? 3 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solar-example-train: %s\n", e.what());
    return 1;
  }
}

// solar-example-train: iterates every epoch of this rank's plan through libsolar, as a training
// loop would. --verify checks every sample's bytes (and label) against the deterministic
// content `solar gen` wrote; --compute-ms spends that long per batch as if training. Prints
// per-epoch data-loading time in the SOLAR artifact's format.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "solar/solar.hpp"
#include "solar/storage/content.h"
#include "solar/storage/sample_source.h"

int main(int argc, char** argv) {
  bool verify = false, quiet = false;
  double compute_ms = 0;
  std::string record;
  CLI::App app{"solar-example-train: a rank program that reads its batches through libsolar.\n"
               "Run it under `solar run` or `srun --solar-*` (it reads SOLAR_* variables).",
               "solar-example-train"};
  app.add_flag("--verify", verify, "Check every sample's content (datasets made by solar gen)");
  app.add_option("--compute-ms", compute_ms, "Milliseconds of compute per batch [0]");
  app.add_option("--record", record, "Write each step's samples to this file (%r: the rank)");
  app.add_flag("--quiet", quiet, "Print only the summary line");
  CLI11_PARSE(app, argc, argv);

  try {
    solar::Loader loader;
    const std::uint32_t rank = loader.rank();
    std::uint64_t seed = 0;
    if (verify) {
      // The content seed is stored with the dataset (solar gen writes it).
      solar::storage::SourceOptions so;
      if (const char* l = std::getenv("SOLAR_LABELS")) so.label_dataset = l;
      auto src = solar::storage::open_source(std::getenv("SOLAR_DATASET"), so);
      if (!src->info().seed)
        throw solar::Error(fmt::format("--verify: {} was not written by solar gen (no seed)",
                                       src->describe()));
      seed = *src->info().seed;
    }
    std::ofstream rec;
    if (const auto at = record.find("%r"); at != std::string::npos)
      record.replace(at, 2, std::to_string(rank));
    if (!record.empty()) {
      rec.open(record);
      if (!rec) throw solar::Error("--record: cannot write " + record);
    }
    std::vector<double> load_s(loader.epochs(), 0.0);
    std::uint64_t samples = 0, bad = 0, batches = 0;
    using Clock = std::chrono::steady_clock;
    for (;;) {
      const auto t0 = Clock::now();
      auto batch = loader.next();
      if (!batch) break;
      const std::uint32_t epoch = batch->epoch();
      load_s[epoch] += std::chrono::duration<double>(Clock::now() - t0).count();
      if (rec) rec << batch->step();
      for (std::size_t i = 0; i < batch->size(); ++i) {
        const std::uint64_t idx = batch->index(i);
        if (rec) rec << ' ' << idx;
        if (verify) {
          const auto s = batch->sample(i);
          bool ok = solar::storage::content::check_sample(seed, idx, s.data(), s.size());
          if (ok && loader.label_bytes() == 4) {
            std::int32_t label;
            std::memcpy(&label, batch->label(i), 4);
            ok = label == solar::storage::content::label(seed, idx);
          }
          if (!ok && bad++ < 5)
            std::fprintf(stderr, "rank %u: sample %llu at step %llu has wrong content\n", rank,
                         static_cast<unsigned long long>(idx),
                         static_cast<unsigned long long>(batch->step()));
        }
      }
      if (rec) rec << std::endl;  // flushed: tests watch progress through it
      samples += batch->size();
      ++batches;
      if (compute_ms > 0)
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(compute_ms));
      batch->release();
    }
    if (rank == 0 || !quiet)
      std::printf("%sDataLoading time SOLAR each epoch: [%s]\n",
                  rank == 0 ? "" : fmt::format("rank {}: ", rank).c_str(),
                  fmt::format("{:.4f}", fmt::join(load_s, ", ")).c_str());
    if (!quiet || bad)
      std::printf("rank %u: %llu batches, %llu samples%s%s, %s\n", rank,
                  static_cast<unsigned long long>(batches),
                  static_cast<unsigned long long>(samples), verify ? ", verified" : "",
                  verify ? fmt::format(" ({} wrong)", bad).c_str() : "",
                  loader.using_agent() ? "from the node agent" : "read directly");
    return bad ? 3 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solar-example-train: %s\n", e.what());
    return 1;
  }
}

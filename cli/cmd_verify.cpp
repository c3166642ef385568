// SPDX-License-Identifier: Apache-2.0
// solar verify: read a source and check every byte against the generator.
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

#include "cmd_storage.h"
#include "commands.h"
#include "options.h"
#include "progress.h"
#include "solar/core/config.h"
#include "solar/core/rng.h"
#include "solar/storage/content.h"
#include "solar/storage/fabric_source.h"
#include "solar/storage/dataset_files.h"
#include "solar/storage/hdf5_writer.h"
#include "solar/storage/npz.h"
#include "solar/storage/sample_source.h"
#include "storage_reads.h"

namespace solar::cli {
namespace {

using storage::SampleRun;
using storage::StorageError;

struct VerifyOptions {
  std::string source;
  std::optional<std::string> range;
  std::optional<std::uint64_t> sample;
  std::optional<std::uint64_t> seed;
  std::string batch = "64M";
  std::string labels = "/label";
  bool progress = true;
  bool json = false;
  SourceFlags flags;
};

// The first ten ids of `v` for a message ("3, 5, 6" or "1, 2, ..., 10, ...").
std::string first_ids(const std::vector<std::uint64_t>& v) {
  std::string out;
  for (std::size_t i = 0; i < std::min<std::size_t>(v.size(), 10); ++i)
    out += (i ? ", " : "") + std::to_string(v[i]);
  return out + (v.size() > 10 ? ", ..." : "");
}

// Whole-file samples written by `solar gen --layout npz`: each file's x against the
// generator (its seed and global id in its `solar` array, or --seed), its y against the label.
void verify_npz(const storage::SampleSource& src, const VerifyOptions& o) {
  const storage::DatasetFiles* set = src.file_set();
  std::vector<std::uint64_t> bad, bad_labels;
  std::uint64_t checked = 0, bytes = 0;
  std::optional<std::uint64_t> seed = o.seed;
  const auto t0 = Clock::now();
  const auto files = set->files();
  ProgressBar bar("verifying", o.progress && !o.json);
  for (const storage::DatasetFile& f : files) {
    std::vector<storage::NpyArray> arrays;
    try {
      arrays = storage::read_npz(f.path);
    } catch (const StorageError& e) {
      std::fprintf(stderr, "solar verify: %s\n", e.what());
      exit_code() = kExitFailure;
      return;
    }
    auto find = [&](const char* name) -> const storage::NpyArray* {
      for (const auto& a : arrays)
        if (a.name == name) return &a;
      return nullptr;
    };
    const storage::NpyArray *x = find("x"), *y = find("y"), *meta = find("solar");
    if (!x || x->descr != "|u1" || (!o.seed && (!meta || meta->data.size() != 16))) {
      std::fprintf(stderr, "solar verify: %s is not a sample of `solar gen --layout npz` (no "
                           "uint8 x%s); nothing to check it against\n",
                   f.path.c_str(), o.seed ? "" : " or no solar array: give --seed");
      exit_code() = kExitFailure;
      return;
    }
    std::uint64_t m[2] = {0, f.first};
    if (meta && meta->data.size() == 16) std::memcpy(m, meta->data.data(), sizeof m);
    if (!seed) seed = m[0];
    // The file's place in the dataset must be the id it was written as.
    if (m[1] != f.first ||
        !storage::content::check_sample(*seed, f.first, x->data.data(), x->data.size()))
      bad.push_back(f.first);
    if (y && !(y->descr == "<i8" && y->data.size() == 8 &&
               storage::content::check_label(*seed, f.first, storage::DType::int64,
                                             y->data.data(), 8)))
      bad_labels.push_back(f.first);
    ++checked;
    bytes += x->data.size();
    bar(checked, files.size());
  }
  const double s = since(t0);
  const bool all_ok = bad.empty() && bad_labels.empty();
  if (o.json) {
    fmt::print("{}\n", nlohmann::json{{"source", src.describe()}, {"samples", checked},
                                      {"bytes", bytes}, {"bad_samples", bad},
                                      {"bad_labels", bad_labels}, {"labels_checked", true},
                                      {"seconds", s}, {"ok", all_ok}}
                           .dump(2));
  } else {
    fmt::print("{}: {} {} .npz samples ({}) and their labels, seed {}\n", src.describe(),
               all_ok ? "verified" : "checked", checked, format_bytes(bytes), seed.value_or(0));
    if (!bad.empty())
      fmt::print("MISMATCH: {} sample(s) differ from the generator (or lie at another place in "
                 "the dataset): {}\n",
                 bad.size(), first_ids(bad));
    if (!bad_labels.empty())
      fmt::print("MISMATCH: {} label(s) differ: {}\n", bad_labels.size(), first_ids(bad_labels));
    if (all_ok) fmt::print("all match\n");
  }
  exit_code() = all_ok ? kExitOk : kExitFailure;
}

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
      src = o.flags.open(o.source, o.labels);
    } catch (const StorageError& e) {
      throw ConfigError("SOURCE", e.what());
    }
    const auto& info = src->info();
    if (info.whole_files) {  // files as they are: npz of `solar gen --layout npz`
      if (o.range || o.sample)
        throw ConfigError(o.range ? "--range" : "--sample",
                          "whole-file samples are checked file by file, all of them; drop it");
      verify_npz(*src, o);
      return;
    }
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
  // Labels of any dtype and size (content.h's fill_label).
  const bool check_labels = info.has_labels && info.label_bytes > 0;
  const std::uint64_t lb = check_labels ? info.label_bytes : 0;
  // One file of a dataset of many (its solar_first): its samples are the dataset's from there.
  const std::uint64_t offset = info.generated_first.value_or(0);
  const auto parts = batches(runs, sb, batch_bytes);
  std::vector<std::byte> buf(std::min(batch_bytes, storage::total_samples(runs) * sb) + sb);
  std::vector<std::byte> labels;
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
        labels.resize(n * lb);
        src->read_labels(part, labels.data());
      }
      std::vector<std::uint64_t> ids;
      for (const auto& r : part)
        for (std::uint64_t i = 0; i < r.count; ++i) ids.push_back(offset + r.first + i);
      std::vector<char> ok(n, 1);
      std::atomic<std::size_t> next{0};
      auto work = [&] {
        for (std::size_t i; (i = next.fetch_add(1)) < n;)
          ok[i] = storage::content::check_sample(seed, ids[i], buf.data() + i * sb, sb,
                                                info.content);
      };
      std::thread helper(work);
      work();
      helper.join();
      for (std::uint64_t i = 0; i < n; ++i) {
        if (!ok[i]) bad.push_back(ids[i]);
        if (check_labels && !storage::content::check_label(seed, ids[i], info.label_dtype,
                                                            labels.data() + i * lb, lb))
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
    fmt::print("{}: {} {} samples of {} {} ({}){}, seed {}{}\n", src->describe(),
               all_ok ? "verified" : "checked", checked, info.shape_string(),
               storage::to_string(info.dtype), format_bytes(bytes),
               check_labels ? " and their labels" : "", seed,
               offset ? fmt::format(", ids from {} (solar_first)", offset) : "");
    fmt::print("read {:.2f} GB/s, overall {:.2f} GB/s ({:.2f} s)\n", gbps(bytes, read_s),
               gbps(bytes, s), s);
    if (!bad.empty())
      fmt::print("MISMATCH: {} sample(s) differ from the generator: {}\n", bad.size(),
                 first_ids(bad));
    if (!bad_labels.empty())
      fmt::print("MISMATCH: {} label(s) differ: {}\n", bad_labels.size(), first_ids(bad_labels));
    if (all_ok) fmt::print("all match\n");
  }
  exit_code() = all_ok ? kExitOk : kExitFailure;
}


}  // namespace

void add_verify_command(CLI::App& app) {
  auto v = std::make_shared<VerifyOptions>();
  CLI::App* verify = app.add_subcommand(
      "verify",
      "Read samples through a source and check every byte (and label) against the generator\n"
      "of `solar gen`. Exit code 0: all match; 1: a mismatch or a read failed; 2: bad input.");
  verify->add_option("source", v->source,
                     "FILE.h5:/dataset (default /data), a directory, glob or @LIST of files "
                     "(DIR/:/split, DIR/:/records[]) or fabric://HOST:PORT/NAME")
      ->type_name(kSource)
      ->required();
  verify->add_option("--labels", v->labels,
                     "Labels dataset in each file ('' for none; /unitPar, /climate/labels_0, "
                     "/labels) [/label]")
      ->type_name("NAME");
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
}

}  // namespace solar::cli

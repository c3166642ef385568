// solar gen: write a generated dataset (content checkable from (seed, index)).
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
#include "solar/storage/hdf5_writer.h"
#include "solar/storage/sample_source.h"
#include "storage_reads.h"

namespace solar::cli {
namespace {

using storage::SampleRun;
using storage::StorageError;

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


}  // namespace

void add_gen_command(CLI::App& app) {
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
}

}  // namespace solar::cli

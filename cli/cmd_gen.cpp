// SPDX-License-Identifier: Apache-2.0
// solar gen: write a generated dataset (content checkable from (seed, index)).
#include <fmt/format.h>
#include <fmt/ranges.h>
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
#include "solar/storage/npz.h"
#include "solar/sys/remove_tree.h"
#include "solar/storage/sample_source.h"
#include "storage_reads.h"

namespace solar::cli {
namespace {

using storage::SampleRun;
using storage::StorageError;

struct GenOptions {
  std::string out;
  std::optional<std::uint64_t> samples;
  std::optional<std::string> preset, shape, dtype, storage_layout;
  std::optional<std::string> content;  // random, sparse (compressible)
  std::string layout = "contiguous";
  std::optional<std::uint64_t> files, samples_per_file, universes_per_dir;
  std::optional<double> size_spread;  // --layout npz: sizes spread ±P% around the mean
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
// More files than this in one dataset is a mistake more often than a wish.
constexpr std::uint64_t kMaxFiles = 10'000'000;

struct Preset {
  const char* name;
  std::vector<std::uint64_t> shape;
  const char* dtype;
};
const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"cosmoflow", {4, 128, 128, 128}, "int16"},  // 16 MiB
      {"small", {4, 32, 32, 32}, "int16"},         // 256 KiB
      {"tiny", {4, 8, 8, 8}, "int16"},             // 4 KiB
      {"deepcam", {768, 1152, 16}, "float32"},     // 54 MiB, MLPerf HPC DeepCAM
      {"dlio", {256, 256}, "uint8"}};              // 64 KiB, DLIO's record_length 65536
  return p;
}
// The preset named `name`; ConfigError("--preset") for any other.
const Preset& find_preset(const std::string& name) {
  for (const auto& x : presets())
    if (name == x.name) return x;
  throw ConfigError("--preset",
                    fmt::format("'{}' is not cosmoflow, small, tiny, deepcam or dlio", name));
}

// OUT must not exist unless --force replaces it.
void check_out(const GenOptions& o) {
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::symlink_status(o.out, ec)) && !o.force)
    throw ConfigError("OUT", fmt::format("{} already exists; pass --force to replace it", o.out));
}

// The preset a layout takes when none is given: the workload's own sample.
const char* default_preset(storage::FilesLayout l) {
  switch (l) {
    case storage::FilesLayout::deepcam: return "deepcam";
    case storage::FilesLayout::dlio: return "dlio";
    default: return "cosmoflow";
  }
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

std::optional<storage::Layout> parse_storage_layout(const std::string& s) {
  if (s == "contiguous") return storage::Layout::contiguous;
  if (s == "chunked") return storage::Layout::chunked;
  if (s == "gzip") return storage::Layout::gzip;
  return std::nullopt;
}

// --layout, --storage-layout and the options only some layouts take, into `spec`.
void parse_layouts(const GenOptions& o, storage::GenSpec& spec) {
  using storage::FilesLayout;
  const std::optional<storage::Layout> stored = parse_storage_layout(o.layout);
  if (stored) spec.files = FilesLayout::single;
  else if (o.layout == "per-sample-files") spec.files = FilesLayout::per_sample_files;
  else if (o.layout == "deepcam") spec.files = FilesLayout::deepcam;
  else if (o.layout == "dlio") spec.files = FilesLayout::dlio;
  else
    throw ConfigError("--layout", fmt::format("'{}' is not contiguous, chunked, gzip (one file) "
                                              "or per-sample-files, deepcam, dlio, npz (a directory)",
                                              o.layout));
  spec.layout = stored.value_or(storage::Layout::contiguous);
  if (o.storage_layout) {
    const auto s = parse_storage_layout(*o.storage_layout);
    if (!s)
      throw ConfigError("--storage-layout", fmt::format("'{}' is not contiguous, chunked or gzip",
                                                        *o.storage_layout));
    if (stored && *s != *stored)
      throw ConfigError("--storage-layout", fmt::format("{} contradicts --layout {}; give one "
                                                        "of them",
                                                        *o.storage_layout, o.layout));
    spec.layout = *s;
  }
  const std::string name(storage::to_string(spec.files));
  if (spec.files != FilesLayout::dlio && (o.files || o.samples_per_file))
    throw ConfigError(o.files ? "--files" : "--samples-per-file",
                      fmt::format("only --layout dlio puts several samples in each of N files; "
                                  "--layout {} writes {}; drop it or use --layout dlio",
                                  o.layout,
                                  spec.files == FilesLayout::single ? "one file"
                                                                    : "one file per sample"));
  if (spec.files != FilesLayout::per_sample_files && o.universes_per_dir)
    throw ConfigError("--universes-per-dir", fmt::format("only --layout per-sample-files has "
                                                         "universes; drop it for --layout {}",
                                                         o.layout));
  if (o.files && (*o.files == 0 || *o.files > kMaxFiles))
    throw ConfigError("--files", fmt::format("must be in 1..{}", kMaxFiles));
  if (o.samples_per_file && (*o.samples_per_file == 0 || *o.samples_per_file > kMaxSamples))
    throw ConfigError("--samples-per-file", fmt::format("must be in 1..{}", kMaxSamples));
  if (o.universes_per_dir && *o.universes_per_dir == 0)
    throw ConfigError("--universes-per-dir", "must be at least 1");
  spec.file_count = o.files.value_or(0);
  spec.samples_per_file = o.samples_per_file.value_or(0);
  spec.universes_per_dir = o.universes_per_dir.value_or(64);
}

// What a reader is told to read the dataset with.
std::string reader_arguments(const storage::GenSpec& spec) {
  return fmt::format("--dataset {} --labels {}", storage::dataset_spec(spec),
                     storage::gen_arrays(spec).labels);
}

// The bytes of the file `path` or of every file below the directory `path`.
std::uint64_t bytes_on_disk(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    const std::uint64_t n = fs::file_size(path, ec);
    return ec ? 0 : n;
  }
  std::uint64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(path, ec))
    if (e.is_regular_file(ec)) total += e.file_size(ec);
  return total;
}

// --layout npz: MLPerf Storage's UNet3D layout (one .npz a sample, np.savez's format) with
// samples of spread sizes: OUT/case_NNNNN.npz holding x (uint8, its own length: the mean
// --preset/--shape/--dtype bytes ±--size-spread%, uniform, drawn from the seed), y (int64, its
// label) and solar (uint64 [seed, global id]); x's bytes are content::fill_sample(seed, id), y
// content::fill_label. Written in a folder beside OUT, moved into place at the end.
void run_gen_npz(const GenOptions& o) {
  std::uint64_t mean = 0, samples = 0;
  double spread = o.size_spread.value_or(50);
  try {
    if (o.files || o.samples_per_file || o.universes_per_dir || o.storage_layout)
      throw ConfigError(o.files ? "--files" : o.samples_per_file ? "--samples-per-file"
                        : o.universes_per_dir ? "--universes-per-dir" : "--storage-layout",
                        "--layout npz writes one .npz file a sample; drop it");
    if (o.content && *o.content != "random")
      throw ConfigError("--content", "--layout npz writes random bytes (np.savez stores them "
                                     "uncompressed, so compressible content changes nothing); "
                                     "drop it");
    if (!o.samples || *o.samples == 0 || *o.samples > kMaxFiles)
      throw ConfigError("--samples", fmt::format("required: the number of files, 1..{}", kMaxFiles));
    samples = *o.samples;
    const Preset* p = &find_preset(o.preset.value_or("small"));
    const auto dtype = storage::parse_dtype(o.dtype.value_or(p->dtype));
    if (!dtype) throw ConfigError("--dtype", fmt::format("'{}' is not a dtype", *o.dtype));
    mean = storage::dtype_size(*dtype);
    for (std::uint64_t d : o.shape ? parse_shape(*o.shape) : p->shape) mean *= d;
    if (spread < 0 || spread >= 100)
      throw ConfigError("--size-spread", fmt::format("{}% is not in 0..99", spread));
    if (static_cast<double>(mean) * (1 + spread / 100) >= static_cast<double>(1ULL << 31))
      throw ConfigError("--shape", fmt::format("the largest .npz sample ({} +{}%) must be under "
                                               "2 GiB (this writer has no zip64)",
                                               format_bytes(mean), spread));
    check_out(o);
  } catch (const ConfigError& e) {
    exit_code() = usage("gen", e.what());
    return;
  }
  namespace fs = std::filesystem;
  const auto lo = static_cast<std::uint64_t>(static_cast<double>(mean) * (1 - spread / 100));
  const auto hi = static_cast<std::uint64_t>(static_cast<double>(mean) * (1 + spread / 100));
  std::vector<std::uint64_t> sizes(samples);
  Xoshiro256 g(o.seed ^ 0x6e707a5f73697a65ULL);  // "npz_size"
  std::uint64_t total = 0;
  for (auto& v : sizes) total += v = std::max<std::uint64_t>(1, lo + g.bounded(hi - lo + 1));
  std::error_code ec;
  const fs::path dir = fs::absolute(o.out, ec).lexically_normal().parent_path();
  if (const fs::space_info space = fs::space(dir, ec); !ec && total + (1ULL << 20) > space.available) {
    exit_code() = usage("gen", fmt::format("--samples: {} would take {}, more than the {} free on "
                                           "{}; nothing written",
                                           o.out, format_bytes(total),
                                           format_bytes(space.available), dir.string()));
    return;
  }
  if (total > kGenConfirmBytes && !o.yes) {
    exit_code() = usage("gen", fmt::format("--samples: {} would take {}, more than {}; pass --yes "
                                           "to write it",
                                           o.out, format_bytes(total),
                                           format_bytes(kGenConfirmBytes)));
    return;
  }
  const int width = std::max<int>(5, static_cast<int>(std::to_string(samples - 1).size()));
  const fs::path out = fs::path(o.out).lexically_normal();
  const fs::path tmp = out.string() + fmt::format(".partial-{}", ::getpid());
  const auto t0 = Clock::now();
  try {
    if (!fs::create_directory(tmp, ec))
      throw StorageError(fmt::format("creating {}: {}", tmp.string(),
                                     ec ? ec.message() : "it exists"));
    ProgressBar bar("writing " + o.out, o.progress);
    std::vector<storage::NpyArray> arrays(3);
    arrays[0] = {"x", "|u1", {0}, {}};
    arrays[1] = {"y", "<i8", {1}, std::vector<std::byte>(8)};
    arrays[2] = {"solar", "<u8", {2}, std::vector<std::byte>(16)};
    for (std::uint64_t id = 0; id < samples; ++id) {
      arrays[0].shape = {sizes[id]};
      arrays[0].data.resize(sizes[id]);
      storage::content::fill_sample(o.seed, id, arrays[0].data.data(), sizes[id]);
      storage::content::fill_label(o.seed, id, storage::DType::int64, arrays[1].data.data(), 8);
      const std::uint64_t meta[2] = {o.seed, id};  // little-endian, as x86 and aarch64 store it
      std::memcpy(arrays[2].data.data(), meta, sizeof meta);
      storage::write_npz((tmp / fmt::format("case_{:0{}}.npz", id, width)).string(), arrays);
      bar(id + 1, samples);
    }
    if (fs::exists(fs::symlink_status(out, ec))) {  // --force: only a folder of .npz files
      bool npz_only = fs::is_directory(fs::symlink_status(out, ec));
      if (npz_only)
        for (const auto& e : fs::directory_iterator(out, ec))
          npz_only = npz_only && e.path().extension() == ".npz";
      if (!npz_only)
        throw StorageError(fmt::format("--force replaces a folder of .npz files only; {} is not "
                                       "one (left as it is)",
                                       out.string()));
      sys::remove_tree(out);
    }
    fs::rename(tmp, out);
  } catch (const std::exception& e) {
    sys::remove_tree(tmp);
    std::fprintf(stderr, "solar gen: %s\n", e.what());
    exit_code() = kExitFailure;
    return;
  }
  const double secs = since(t0);
  fmt::print("wrote {}: {} .npz files (case_{:0{}}.npz ..), one sample each: x uint8 of {} to {} "
             "bytes (mean {}, ±{}%), y int64, {} in all, seed {}; {:.1f} s ({:.2f} GB/s)\n",
             o.out, samples, 0, width, lo, hi, total / samples, spread, format_bytes(total),
             o.seed, secs, gbps(total, secs));
  fmt::print("read it with: --dataset '{}/*.npz' --transparent (np.load in the script); check it "
             "with: solar verify '{}/*.npz'\n",
             o.out, o.out);
}

void run_gen(const GenOptions& o) {
  if (o.layout == "npz") {
    run_gen_npz(o);
    return;
  }
  if (o.size_spread) {
    exit_code() = usage("gen", "--size-spread: only --layout npz writes samples of differing "
                               "sizes; drop it or use --layout npz");
    return;
  }
  storage::GenSpec spec;
  std::vector<storage::GenFile> files;
  try {
    spec.path = o.out;
    parse_layouts(o, spec);
    if (!o.samples && spec.files == storage::FilesLayout::dlio && o.files && o.samples_per_file &&
        *o.files * *o.samples_per_file <= kMaxSamples)
      spec.samples = *o.files * *o.samples_per_file;  // every file full
    else if (!o.samples)
      throw ConfigError("--samples", "required (number of samples, ≥ 1)");
    else
      spec.samples = *o.samples;
    if (spec.samples == 0 || spec.samples > kMaxSamples)
      throw ConfigError("--samples", fmt::format("must be in 1..{}", kMaxSamples));
    const Preset* p = &find_preset(o.preset.value_or(default_preset(spec.files)));
    spec.shape = o.shape ? parse_shape(*o.shape) : p->shape;
    const std::string dt = o.dtype.value_or(p->dtype);
    auto dtype = storage::parse_dtype(dt);
    if (!dtype)
      throw ConfigError("--dtype", fmt::format("'{}' is not one of int8, uint8, int16, uint16, "
                                               "int32, uint32, int64, uint64, float32, float64",
                                               dt));
    spec.dtype = *dtype;
    spec.seed = o.seed;
    if (o.content) {
      const auto c = storage::content::parse_content(*o.content);
      if (!c)
        throw ConfigError("--content", fmt::format("'{}' is not random or sparse", *o.content));
      spec.content = *c;
    }
    spec.force = o.force;
    try {
      files = storage::gen_files(spec);
    } catch (const StorageError& e) {
      const std::string what = e.what();
      const auto colon = what.find(": ");
      throw ConfigError(what.substr(0, colon), what.substr(colon + 2));
    }
    if (files.size() > kMaxFiles)
      throw ConfigError("--samples", fmt::format("--layout {} would write {} files, more than "
                                                 "{}; write fewer samples, or several samples a "
                                                 "file with --layout dlio",
                                                 o.layout, files.size(), kMaxFiles));
    check_out(o);
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
  // What it will write (data, labels, each file's metadata), against the free space.
  const std::uint64_t total = storage::dataset_bytes(spec);
  const bool huge = total == ~std::uint64_t{0};
  const std::string size_text = fmt::format("{}{} ({} samples of {}{})", huge ? "more than " : "",
                                            format_bytes(total), spec.samples, format_bytes(sb),
                                            files.size() > 1
                                                ? fmt::format(" in {} files", files.size())
                                                : "");
  {
    // The dataset is written beside OUT and moved into place at the end: one it replaces
    // (--force) still takes its space until then.
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path dir = fs::absolute(o.out, ec).lexically_normal().parent_path();
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
  const std::string shape = fmt::format("{}", fmt::join(spec.shape, "x"));
  const storage::GenArrays arrays = storage::gen_arrays(spec);
  const std::string label_shape = fmt::format("{}", fmt::join(arrays.label_shape, "x"));
  const std::string content_note = spec.content == storage::Content::sparse
                                       ? fmt::format(", content sparse ({} on disk)",
                                                     format_bytes(bytes_on_disk(o.out)))
                                       : "";
  if (spec.files == storage::FilesLayout::single) {
    fmt::print("wrote {}: /data {} samples of {} {} ({} each, {} in all), layout {}, seed {}{}; "
               "/label int32; {:.1f} s ({:.2f} GB/s)\n",
               o.out, spec.samples, shape, storage::to_string(spec.dtype), format_bytes(sb),
               format_bytes(sb * spec.samples), storage::to_string(spec.layout), spec.seed,
               content_note, s, gbps(sb * spec.samples, s));
  } else {
    const auto& first = files.front();
    fmt::print("wrote {}: {} files ({} to {}), {} {} samples of {} {} ({} each, {} in all{}), "
               "{} {}{} a sample, arrays {}, seed {}{}; {:.1f} s ({:.2f} GB/s)\n",
               o.out, files.size(), first.path, files.back().path, arrays.data, spec.samples,
               shape, storage::to_string(spec.dtype), format_bytes(sb),
               format_bytes(sb * spec.samples),
               spec.files == storage::FilesLayout::dlio
                   ? fmt::format(", {} a file", first.count) +
                         (files.back().count != first.count
                              ? fmt::format(", the last {}", files.back().count)
                              : "")
                   : "",
               arrays.labels, storage::to_string(arrays.label_dtype),
               label_shape.empty() ? "" : " " + label_shape, storage::to_string(spec.layout),
               spec.seed, content_note, s, gbps(sb * spec.samples, s));
  }
  fmt::print("read it with: {}\n", reader_arguments(spec));
}


}  // namespace

void add_gen_command(CLI::App& app) {
  auto g = std::make_shared<GenOptions>();
  CLI::App* gen = app.add_subcommand(
      "gen",
      "Write a dataset whose content is a deterministic function of the seed and each sample's\n"
      "global id (files in sorted path order, then the samples within each), so that `solar\n"
      "verify` and `solar-example-train --verify` can check every byte and label. --layout:\n"
      "  contiguous, chunked, gzip  one file OUT: /data (N samples) and /label (int32 each)\n"
      "  per-sample-files  the SOLAR artifact's CosmoFlow: a directory OUT of universes of 64\n"
      "      samples, --universes-per-dir (64) a subfolder, one sample a file:\n"
      "      OUT/000/univ0000_000.hdf5 .. with /split (the sample) and /unitPar (float32, 4)\n"
      "  deepcam  MLPerf HPC DeepCAM: OUT/data-000000.h5 .., one sample a file: /climate/data\n"
      "      (H x W x C, preset deepcam) and /climate/labels_0 (int32, H x W)\n"
      "  dlio  DLIO / MLPerf Storage: --files N, OUT/img_0_of_N.hdf5 .. with /records (rows of\n"
      "      samples, preset dlio: 256x256 uint8) and /labels (int64 each); --samples over the\n"
      "      files (or --samples-per-file K), the last file shorter when they do not divide\n"
      "  npz  MLPerf Storage's UNet3D: OUT/case_00000.npz .., one sample a file (np.savez's\n"
      "      format): x uint8 of its own size, the preset's bytes (small) +-`--size-spread`%\n"
      "      (50), y int64 its label; whole-file samples, served in the transparent mode\n"
      "The arrays of a directory's files are stored as --storage-layout says. It prints the\n"
      "--dataset and --labels to read it with. Every file is written to a temporary and renamed,\n"
      "a directory as a whole beside OUT and moved into place at the end: a dataset at OUT is\n"
      "complete. Size: N x the sample size (--preset/--shape/--dtype) + labels + metadata. It\n"
      "refuses (exit 2, nothing written) anything larger than the free space where OUT goes,\n"
      "asks for --yes above 10 GiB, and says how much it writes from 1 GiB on.");
  gen->add_option("out", g->out, "The HDF5 file (OUT.h5) or directory to write")
      ->type_name(kFile)
      ->required();
  gen->add_option("--samples", g->samples,
                  "Number of samples N (required; dlio: or --files x --samples-per-file)")
      ->type_name(kUint);
  gen->add_option("--preset", g->preset,
                  "Sample shape and dtype: cosmoflow = 4x128x128x128 int16 (16 MiB), small = "
                  "4x32x32x32 int16 (256 KiB), tiny = 4x8x8x8 int16 (4 KiB), deepcam = "
                  "768x1152x16 float32 (54 MiB), dlio = 256x256 uint8 (64 KiB) [the layout's: "
                  "deepcam, dlio, else cosmoflow]")
      ->type_name("NAME");
  gen->add_option("--shape", g->shape, "Shape of one sample, e.g. 4,128,128,128 (overrides the preset)")
      ->type_name("UINT,...");
  gen->add_option("--dtype", g->dtype,
                  "int8, uint8, int16, uint16, int32, uint32, int64, uint64, float32, float64 "
                  "(overrides the preset)")
      ->type_name("DTYPE");
  gen->add_option("--layout", g->layout,
                  "One file: contiguous (raw, fastest), chunked (one sample per chunk), gzip "
                  "(chunked + deflate level 1); a directory: per-sample-files, deepcam, dlio, "
                  "npz (above) [contiguous]")
      ->type_name("LAYOUT");
  gen->add_option("--storage-layout", g->storage_layout,
                  "How the arrays of a directory's files are stored: contiguous, chunked, gzip "
                  "[contiguous]")
      ->type_name("LAYOUT");
  gen->add_option("--files", g->files, "dlio: number of files N")->type_name(kUint);
  gen->add_option("--samples-per-file", g->samples_per_file,
                  "dlio: samples in each file but the last [N / --files, rounded up]")
      ->type_name(kUint);
  gen->add_option("--universes-per-dir", g->universes_per_dir,
                  "per-sample-files: universes (64 samples each) a subfolder [64]")
      ->type_name(kUint);
  gen->add_option("--size-spread", g->size_spread,
                  "npz: each file's x of the mean bytes +-P%, uniform over that range [50]")
      ->type_name("P");
  gen->add_option("--content", g->content,
                  "random (incompressible) or sparse: three bytes in four zero, the rest 1..4, "
                  "which --layout/--storage-layout gzip (deflate level 1) keeps at 29%, like "
                  "CosmoFlow's counts; checked as random is [random]")
      ->type_name("CONTENT");
  gen->add_option("--seed", g->seed, "Content seed [0]")->type_name(kUint);
  gen->add_flag("--force", g->force,
                "Replace OUT if it exists (a directory only when it holds HDF5 files alone)");
  gen->add_flag("-y,--yes", g->yes,
                "Write more than 10 GiB (never more than the free space)");
  gen->add_flag_callback("--no-progress", [g] { g->progress = false; }, "No progress bar");
  gen->callback([g] { run_gen(*g); });
}

}  // namespace solar::cli

// SPDX-License-Identifier: Apache-2.0
// HDF5 sources over real files: written by solar gen (every layout) and by h5py.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "solar/storage/content.h"
#include "solar/storage/hdf5_source.h"
#include "solar/storage/hdf5_writer.h"
#include "test_util.h"

namespace solar::storage {
namespace {
using test::TempDir;

GenSpec small_spec(const std::string& path, Layout layout, std::uint64_t samples = 37) {
  GenSpec s;
  s.path = path;
  s.samples = samples;
  s.shape = {3, 5, 7};  // 105 int16 = 210 bytes: not a multiple of 8, exercises the tail
  s.dtype = DType::int16;
  s.layout = layout;
  s.seed = 11;
  return s;
}

// Reads `runs` and checks every sample and label against the generator.
void expect_content(SampleSource& src, const std::vector<SampleRun>& runs, std::uint64_t seed) {
  const auto& info = src.info();
  std::vector<std::byte> buf(total_samples(runs) * info.sample_bytes);
  src.read(runs, buf.data());
  std::vector<std::int32_t> labels(total_samples(runs));
  ASSERT_TRUE(info.has_labels);
  src.read_labels(runs, reinterpret_cast<std::byte*>(labels.data()));
  std::size_t k = 0;
  for (const auto& r : runs)
    for (std::uint64_t i = r.first; i < r.first + r.count; ++i, ++k) {
      EXPECT_TRUE(content::check_sample(seed, i, buf.data() + k * info.sample_bytes,
                                        info.sample_bytes))
          << "sample " << i;
      EXPECT_EQ(labels[k], content::label(seed, i)) << "label " << i;
    }
}

TEST(Content, RoundTripAndDetectsOneFlippedByte) {
  std::vector<std::byte> a(1001);
  content::fill_sample(3, 42, a.data(), a.size());
  EXPECT_TRUE(content::check_sample(3, 42, a.data(), a.size()));
  EXPECT_FALSE(content::check_sample(3, 43, a.data(), a.size()));
  EXPECT_FALSE(content::check_sample(4, 42, a.data(), a.size()));
  for (std::size_t pos : {0, 500, 999, 1000}) {
    auto b = a;
    b[pos] ^= std::byte{1};
    EXPECT_FALSE(content::check_sample(3, 42, b.data(), b.size())) << pos;
  }
  EXPECT_EQ(content::label(3, 42), content::label(3, 42));
}

TEST(Content, SparseIsTheRandomContentMappedBytewiseAndIsCheckedAsItself) {
  std::vector<std::byte> r(1001), s(1001);
  content::fill_sample(3, 42, r.data(), r.size());
  content::fill_sample(3, 42, s.data(), s.size(), Content::sparse);
  std::size_t zeros = 0;
  for (std::size_t i = 0; i < r.size(); ++i) {
    const auto v = std::to_integer<unsigned>(r[i]);
    ASSERT_EQ(std::to_integer<unsigned>(s[i]), v < 192 ? 0U : 1 + (v & 3)) << i;
    zeros += s[i] == std::byte{0};
  }
  EXPECT_GT(zeros, 650U);
  EXPECT_LT(zeros, 850U);
  EXPECT_TRUE(content::check_sample(3, 42, s.data(), s.size(), Content::sparse));
  EXPECT_FALSE(content::check_sample(3, 42, s.data(), s.size()));
  EXPECT_FALSE(content::check_sample(3, 42, r.data(), r.size(), Content::sparse));
  s[1000] ^= std::byte{8};
  EXPECT_FALSE(content::check_sample(3, 42, s.data(), s.size(), Content::sparse));
  EXPECT_EQ(content::generator(Content::sparse), "solar-splitmix64-sparse-v1");
  EXPECT_EQ(content::parse_generator("solar-splitmix64-v1"), Content::random);
  EXPECT_EQ(content::parse_generator("solar-splitmix64-v2"), std::nullopt);
}

TEST(Coalesce, SortsDeduplicatesAndMergesRuns) {
  EXPECT_EQ(coalesce({5, 1, 2, 3, 9, 2, 10}),
            (std::vector<SampleRun>{{1, 3}, {5, 1}, {9, 2}}));
  EXPECT_TRUE(coalesce({}).empty());
}

class GenLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(GenLayouts, ReadsBackEveryByteAndLabel) {
  TempDir dir;
  const auto spec = small_spec(dir.file("d.h5"), GetParam());
  write_dataset(spec);
  auto src = Hdf5Source::open(spec.path, "/data");
  const auto& info = src->info();
  EXPECT_EQ(info.samples, 37u);
  EXPECT_EQ(info.sample_shape, (std::vector<std::uint64_t>{3, 5, 7}));
  EXPECT_EQ(info.dtype, DType::int16);
  EXPECT_EQ(info.sample_bytes, 210u);
  ASSERT_TRUE(info.seed.has_value());
  EXPECT_EQ(*info.seed, 11u);
  EXPECT_EQ(src->raw_offset().has_value(), GetParam() == Layout::contiguous);
  expect_content(*src, {{0, 37}}, 11);
  expect_content(*src, {{30, 2}, {3, 1}, {5, 10}, {36, 1}}, 11);  // any order
}

TEST_P(GenLayouts, DirectReadsGiveTheSameBytes) {
  TempDir dir;
  auto spec = small_spec(dir.file("d.h5"), GetParam(), 300);
  write_dataset(spec);
  Hdf5Options o;
  o.direct = true;
  o.request_bytes = 1000;  // pieces that start and end off any 4 KiB boundary
  auto src = Hdf5Source::open(spec.path, "/data", o);
  expect_content(*src, {{0, 300}}, 11);
  expect_content(*src, {{299, 1}, {0, 1}, {17, 40}, {150, 3}}, 11);  // the last sample too
  // Raw layouts went through O_DIRECT (this file system allows it); gzip is read by HDF5.
  if (GetParam() == Layout::gzip) EXPECT_EQ(src->direct_reads(), 0u);
  else EXPECT_GT(src->direct_reads(), 0u);
}

// --read-gap: pieces close together in the file are one request, the gap read and dropped;
// every sample is still its own bytes, in the order asked, with and without O_DIRECT.
TEST_P(GenLayouts, ReadGapMergesNearbyPiecesIntoOneRequest) {
  TempDir dir;
  auto spec = small_spec(dir.file("d.h5"), GetParam(), 300);  // 210-byte samples
  write_dataset(spec);
  for (const bool direct : {false, true}) {
    Hdf5Options plain;
    plain.direct = direct;
    Hdf5Options merged = plain;
    merged.read_gap = 3 * 210;  // up to 3 samples between two pieces
    auto one_each = Hdf5Source::open(spec.path, "/data", plain);
    auto src = Hdf5Source::open(spec.path, "/data", merged);
    // Out of order; gaps of 1, 3 and 4 samples; 200 stands alone.
    const std::vector<SampleRun> runs = {{40, 2}, {10, 1}, {12, 2}, {17, 1}, {22, 3}, {200, 1}};
    expect_content(*one_each, runs, 11);
    expect_content(*src, runs, 11);
    if (GetParam() == Layout::gzip) {  // read by HDF5, chunk by chunk: nothing to merge
      EXPECT_EQ(src->requests(), 0u);
      continue;
    }
    EXPECT_EQ(one_each->requests(), 6u) << direct;  // one per run
    // {10..17} (gaps of 1 and 3 samples), {22..24} (4 after 17), {40, 41}, {200}; a chunked
    // file's one-sample chunks are as close only where HDF5 laid them out in order.
    if (GetParam() == Layout::contiguous) EXPECT_EQ(src->requests(), 4u) << direct;
    else EXPECT_LT(src->requests(), one_each->requests()) << direct;
  }
}

INSTANTIATE_TEST_SUITE_P(Storage, GenLayouts,
                         ::testing::Values(Layout::contiguous, Layout::chunked, Layout::gzip),
                         [](const auto& p) { return std::string(to_string(p.param)); });

TEST(Hdf5Source, ConcurrentReadersGetTheirOwnSamples) {
  TempDir dir;
  for (Layout l : {Layout::contiguous, Layout::chunked}) {
    auto spec = small_spec(dir.file("c.h5"), l, 200);
    spec.force = true;
    write_dataset(spec);
    Hdf5Options o;
    o.io_threads = 4;
    o.request_bytes = 512;  // many small preads per call
    auto src = Hdf5Source::open(spec.path, "/data", o);
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&, t] {
        for (int rep = 0; rep < 5; ++rep)
          expect_content(*src, {{std::uint64_t(t * 40), 40}, {std::uint64_t(199 - t), 1}}, 11);
      });
    for (auto& t : ts) t.join();
  }
}

TEST(Hdf5Source, RejectsReadsOutsideTheDataset) {
  TempDir dir;
  const auto spec = small_spec(dir.file("d.h5"), Layout::contiguous);
  write_dataset(spec);
  auto src = Hdf5Source::open(spec.path, "/data");
  std::vector<std::byte> buf(210 * 10);
  const SampleRun past{36, 2};
  try {
    src->read({&past, 1}, buf.data());
    FAIL() << "no error";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("samples [36, 38)"), std::string::npos) << e.what();
  }
}

void expect_open_error(const std::string& path, const std::string& dataset,
                       const std::string& needle) {
  try {
    Hdf5Source::open(path, dataset);
    FAIL() << "opened " << path << ":" << dataset;
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Hdf5Source, ClearErrorsForBadFilesAndDatasets) {
  TempDir dir;
  expect_open_error(dir.file("missing.h5"), "/data", "No such file");
  {
    std::ofstream(dir.file("text.h5")) << "not hdf5\n";
  }
  expect_open_error(dir.file("text.h5"), "/data", "not an HDF5 file");
  const auto spec = small_spec(dir.file("d.h5"), Layout::contiguous, 400);
  write_dataset(spec);
  expect_open_error(spec.path, "/nope", "no dataset '/nope' (datasets at the top level: /data, /label)");
  // A copy cut in half: refused at open, never read as short data.
  const auto size = std::filesystem::file_size(spec.path);
  std::filesystem::copy_file(spec.path, dir.file("cut.h5"));
  std::filesystem::resize_file(dir.file("cut.h5"), size / 2);
  expect_open_error(dir.file("cut.h5"), "/data", "truncated");
}

TEST(Hdf5Writer, RefusesToOverwriteWithoutForce) {
  TempDir dir;
  auto spec = small_spec(dir.file("d.h5"), Layout::contiguous);
  write_dataset(spec);
  EXPECT_THROW(write_dataset(spec), StorageError);
  spec.force = true;
  spec.seed = 12;
  write_dataset(spec);
  EXPECT_EQ(*Hdf5Source::open(spec.path, "/data")->info().seed, 12u);
  // Nothing but the file itself is left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
}

class H5pyLayouts : public ::testing::TestWithParam<std::string> {};

TEST_P(H5pyLayouts, FilesWrittenByH5pyVerify) {
  if (!test::have_h5py()) GTEST_SKIP() << "/usr/bin/python3 with h5py and numpy is not installed";
  TempDir dir;
  const std::string path = dir.file("py.h5");
  std::string out;
  ASSERT_EQ(test::run({"/usr/bin/python3", SOLAR_H5PY_SCRIPT, path, "--samples", "23", "--shape",
                       "4,6,5", "--layout", GetParam(), "--seed", "9"},
                      &out),
            0)
      << out;
  auto src = Hdf5Source::open(path, "/data");
  EXPECT_EQ(src->info().samples, 23u);
  EXPECT_EQ(src->info().sample_bytes, 4u * 6 * 5 * 2);
  ASSERT_TRUE(src->info().seed.has_value());  // h5py's variable-length string attribute
  EXPECT_EQ(*src->info().seed, 9u);
  expect_content(*src, {{0, 23}}, 9);
  expect_content(*src, {{22, 1}, {1, 3}}, 9);
  // And through the CLI, as a user would.
  EXPECT_EQ(test::run({SOLAR_CLI, "verify", path + ":/data", "--no-progress"}, &out), 0) << out;
}

INSTANTIATE_TEST_SUITE_P(Storage, H5pyLayouts,
                         ::testing::Values("contiguous", "chunked", "gzip"));

TEST(Hdf5Source, H5pyFloatDatasetAndScalarDataset) {
  if (!test::have_h5py()) GTEST_SKIP() << "/usr/bin/python3 with h5py and numpy is not installed";
  TempDir dir;
  std::string out;
  ASSERT_EQ(test::run({"/usr/bin/python3", SOLAR_H5PY_SCRIPT, dir.file("f.h5"), "--samples", "8",
                       "--shape", "3,3", "--dtype", "float32", "--no-attrs", "--seed", "4"},
                      &out),
            0)
      << out;
  auto src = Hdf5Source::open(dir.file("f.h5"), "/data");
  EXPECT_EQ(src->info().dtype, DType::float32);
  EXPECT_FALSE(src->info().seed.has_value());
  expect_content(*src, {{0, 8}}, 4);
  ASSERT_EQ(test::run({"/usr/bin/python3", SOLAR_H5PY_SCRIPT, dir.file("s.h5"), "--scalar"}, &out),
            0)
      << out;
  expect_open_error(dir.file("s.h5"), "/data", "rank 0");
}

TEST(Cli, GenVerifyAndUsageErrors) {
  TempDir dir;
  const std::string f = dir.file("g.h5");
  std::string out;
  EXPECT_EQ(test::run({SOLAR_CLI, "gen", f, "--samples", "20", "--preset", "tiny", "--layout",
                       "gzip", "--seed", "3", "--no-progress"},
                      &out),
            0)
      << out;
  EXPECT_EQ(test::run({SOLAR_CLI, "verify", f, "--no-progress"}, &out), 0) << out;
  EXPECT_NE(out.find("all match"), std::string::npos) << out;
  EXPECT_EQ(test::run({SOLAR_CLI, "verify", f, "--seed", "4", "--no-progress"}, &out), 1) << out;
  EXPECT_NE(out.find("MISMATCH"), std::string::npos) << out;
  EXPECT_EQ(test::run({SOLAR_CLI, "verify", f, "--range", "5:25"}, &out), 2) << out;
  EXPECT_NE(out.find("--range"), std::string::npos) << out;
  EXPECT_EQ(test::run({SOLAR_CLI, "gen", f, "--samples", "20"}, &out), 2) << out;
  EXPECT_NE(out.find("--force"), std::string::npos) << out;
  EXPECT_EQ(test::run({SOLAR_CLI, "gen", dir.file("x.h5"), "--samples", "2", "--shape", "4,,3"}, &out), 2);
  EXPECT_NE(out.find("--shape"), std::string::npos) << out;
  EXPECT_EQ(test::run({SOLAR_CLI, "gen", dir.file("x.h5"), "--samples", "2", "--dtype", "int17"}, &out), 2);
  EXPECT_NE(out.find("--dtype"), std::string::npos) << out;
  EXPECT_EQ(test::run({SOLAR_CLI, "bench", "io", f, "--warm", "--json"}, &out), 0) << out;
  EXPECT_NE(out.find("vs_sequential"), std::string::npos) << out;
}

}  // namespace
}  // namespace solar::storage

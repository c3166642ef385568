// SPDX-License-Identifier: Apache-2.0
// Datasets of many files (solar/storage/dataset_files.h): listing a directory, a glob and a
// list, the global sample order, the index file, reads across files, and the refusals (a file
// that differs, is replaced, rewritten, deleted, or is not HDF5). Real HDF5 files written by
// storage's own writer, each file with its own seed so that a byte from the wrong file shows.
#include "solar/storage/dataset_files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <zlib.h>

#include <fmt/format.h>

#include "solar/storage/content.h"
#include "solar/storage/hdf5_writer.h"
#include "solar/storage/sample_source.h"
#include "test_util.h"

namespace solar::storage {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::TempDir;

const std::vector<std::uint64_t> kShape = {2, 4, 4};  // 64 bytes of int16

// A file of `samples` rows at `rel` below `dir`, content seed `seed`.
std::string put(const TempDir& dir, const std::string& rel, std::uint64_t samples,
                std::uint64_t seed, std::vector<std::uint64_t> shape = kShape) {
  GenSpec s;
  s.path = dir.file(rel);
  fs::create_directories(fs::path(s.path).parent_path());
  s.samples = samples;
  s.shape = std::move(shape);
  s.seed = seed;
  s.force = true;
  write_dataset(s);
  return s.path;
}

struct Expect {  // global sample g is local sample `local` of the file of seed `seed`
  std::uint64_t seed, local;
};

// Reads every sample one run at a time and all together, and checks each byte and label.
void expect_samples(SampleSource& src, const std::vector<Expect>& want) {
  const DatasetInfo& info = src.info();
  ASSERT_EQ(info.samples, want.size());
  std::vector<std::byte> all(want.size() * info.sample_bytes);
  const SampleRun everything{0, want.size()};
  src.read({&everything, 1}, all.data());
  std::vector<std::int32_t> labels(want.size());
  src.read_labels({&everything, 1}, reinterpret_cast<std::byte*>(labels.data()));
  for (std::size_t g = 0; g < want.size(); ++g) {
    EXPECT_TRUE(content::check_sample(want[g].seed, want[g].local,
                                      all.data() + g * info.sample_bytes, info.sample_bytes))
        << "sample " << g;
    EXPECT_EQ(labels[g], content::label(want[g].seed, want[g].local)) << "label " << g;
  }
  // Runs crossing file boundaries, out of order: each lands where asked.
  const std::vector<SampleRun> runs = {{want.size() - 3, 3}, {0, 2}, {1, want.size() - 2}};
  std::vector<std::byte> some(total_samples(runs) * info.sample_bytes);
  src.read(runs, some.data());
  std::size_t k = 0;
  for (const auto& r : runs)
    for (std::uint64_t g = r.first; g < r.first + r.count; ++g, ++k)
      EXPECT_TRUE(content::check_sample(want[g].seed, want[g].local,
                                        some.data() + k * info.sample_bytes, info.sample_bytes))
          << "run sample " << g;
}

TEST(DatasetFiles, ADirectoryIsItsHdf5FilesInSortedPathOrderRowsWithBrackets) {
  TempDir dir;
  put(dir, "train/b/x.h5", 3, 12);
  put(dir, "train/a/z.hdf5", 5, 11);
  put(dir, "train/a/zz.h5", 4, 13);
  std::ofstream(dir.file("train/a/README.txt")) << "not a sample file\n";
  const std::string spec = dir.file("train") + ":/data[]";
  ASSERT_TRUE(names_many_files(spec));
  auto src = open_source(spec);
  std::vector<Expect> want;
  for (std::uint64_t i = 0; i < 5; ++i) want.push_back({11, i});  // a/z.hdf5
  for (std::uint64_t i = 0; i < 4; ++i) want.push_back({13, i});  // a/zz.h5
  for (std::uint64_t i = 0; i < 3; ++i) want.push_back({12, i});  // b/x.h5
  expect_samples(*src, want);
  ASSERT_NE(src->file_set(), nullptr);
  const auto files = src->file_set()->files();
  ASSERT_EQ(files.size(), 3U);
  EXPECT_EQ(files[1].first, 5U);
  EXPECT_EQ(files[2].first, 9U);
  EXPECT_TRUE(files[0].raw());
  EXPECT_EQ(src->info().sample_shape, kShape);
  EXPECT_NE(src->identity().find("files 3 samples 12"), std::string::npos) << src->identity();
}

TEST(DatasetFiles, WithoutBracketsEachFileIsOneSample) {
  TempDir dir;
  for (int k = 0; k < 4; ++k) put(dir, fmt::format("u/{:03}.h5", k), 1, 20 + k);
  auto src = open_source(dir.file("u") + ":/data");
  EXPECT_EQ(src->info().samples, 4U);
  EXPECT_EQ(src->info().sample_shape, (std::vector<std::uint64_t>{1, 2, 4, 4}));
  // One sample per file: the whole array of 1 row, content of row 0.
  std::vector<Expect> want;
  for (std::uint64_t k = 0; k < 4; ++k) want.push_back({20 + k, 0});
  expect_samples(*src, want);
}

TEST(DatasetFiles, AGlobAndAListNameTheSameFilesAListInItsOwnOrder) {
  TempDir dir;
  put(dir, "g/0.h5", 2, 1);
  put(dir, "g/1.h5", 3, 2);
  put(dir, "g/2.h5", 2, 3);
  auto by_dir = open_source(dir.file("g") + ":/data[]");
  auto by_glob = open_source(dir.file("g") + "/*.h5:/data[]");
  EXPECT_EQ(by_glob->info().samples, 7U);
  // The identity hashes the files and their content, not how they were named.
  EXPECT_EQ(by_dir->identity(), by_glob->identity());
  // A list: relative paths are relative to the list's folder; its order is the sample order.
  std::ofstream(dir.file("g/list.txt")) << "# the order a script's index pickle gives\n"
                                        << "2.h5\n\n"
                                        << dir.file("g/0.h5") << "\n1.h5\n";
  auto by_list = open_source("@" + dir.file("g/list.txt") + ":/data[]");
  std::vector<Expect> want = {{3, 0}, {3, 1}, {1, 0}, {1, 1}, {2, 0}, {2, 1}, {2, 2}};
  expect_samples(*by_list, want);
  EXPECT_NE(by_list->identity(), by_dir->identity());
  // Twice the same file: refused, naming it.
  std::ofstream(dir.file("g/twice.txt")) << "0.h5\n1.h5\n0.h5\n";
  EXPECT_NE(error_of([&] { open_source("@" + dir.file("g/twice.txt") + ":/data[]"); })
                .find("a second time"),
            std::string::npos);
  EXPECT_NE(error_of([&] { open_source(dir.file("g") + "/*.nope:/data[]"); })
                .find("no files match"),
            std::string::npos);
}

TEST(DatasetFiles, TheIndexFileIsReadInsteadOfAScanAndMustBeForTheSameSpec) {
  TempDir dir;
  put(dir, "d/a.h5", 4, 7);
  put(dir, "d/b.h5", 2, 8);
  const std::string spec = dir.file("d") + ":/data[]";
  DatasetIndex x = scan_dataset(spec, "/label");
  ASSERT_EQ(x.files.size(), 2U);
  ASSERT_EQ(x.files[0].labels.size(), 4U * 4);  // small labels live in the index
  const std::string path = dir.file("index.txt");
  write_index(x, path);
  DatasetIndex y = read_index(path, spec, "/label");
  EXPECT_EQ(y.identity, x.identity);
  EXPECT_EQ(y.info.samples, 6U);
  EXPECT_EQ(y.files[1].first, 4U);
  EXPECT_EQ(y.files[0].labels, x.files[0].labels);
  EXPECT_EQ(y.files[1].data_offset, x.files[1].data_offset);
  // The seed and its content kind survive the index.
  x.info.seed = 11;
  x.info.content = Content::sparse;
  write_index(x, path);
  y = read_index(path, spec, "/label");
  EXPECT_EQ(y.info.seed, std::optional<std::uint64_t>{11});
  EXPECT_EQ(y.info.content, Content::sparse);
  // Another spec, other labels, a damaged file: each refused with what to do.
  EXPECT_NE(error_of([&] { read_index(path, dir.file("d") + ":/data", "/label"); })
                .find("was made for"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_index(path, spec, ""); }).find("labels"), std::string::npos);
  {
    std::stringstream text;
    text << std::ifstream(path).rdbuf();
    std::string s = text.str();
    const auto at = s.find("\n4 ");  // the first file's count
    ASSERT_NE(at, std::string::npos) << s;
    s[at + 1] = '3';
    std::ofstream(dir.file("bad.txt")) << s;
  }
  EXPECT_NE(error_of([&] { read_index(dir.file("bad.txt"), spec, "/label"); }), "(no error)");
  // Opened through the index: the same samples, and no scan (a file put there since is not
  // part of the dataset the index describes).
  put(dir, "d/c.h5", 3, 9);
  SourceOptions so;
  so.index_path = path;
  auto src = open_source(spec, so);
  EXPECT_EQ(src->identity(), x.identity);
  expect_samples(*src, {{7, 0}, {7, 1}, {7, 2}, {7, 3}, {8, 0}, {8, 1}});
  // No index there: the dataset is scanned (and now has c.h5).
  so.index_path = dir.file("missing-index.txt");
  EXPECT_EQ(open_source(spec, so)->info().samples, 9U);
}

TEST(DatasetFiles, AScanTakesUnchangedFilesFromThePreviousIndexAndReopensChangedOnes) {
  TempDir dir;
  put(dir, "p/0.h5", 2, 1);
  put(dir, "p/1.h5", 2, 2);
  const std::string spec = dir.file("p") + ":/data[]";
  DatasetIndex first = scan_dataset(spec, "/label");
  // An entry only the previous index has (no open would give it): taken over while the file's
  // stat is the one indexed.
  DatasetIndex marked = first;
  marked.files[1].data_offset = 12345;
  EXPECT_EQ(scan_dataset(spec, "/label", {}, &marked).files[1].data_offset, 12345U);
  // Rewritten (another row count): opened again, so the new count and offset are seen.
  put(dir, "p/1.h5", 3, 2);
  DatasetIndex again = scan_dataset(spec, "/label", {}, &marked);
  EXPECT_EQ(again.files[1].count, 3U);
  EXPECT_EQ(again.files[1].data_offset, first.files[1].data_offset);
  EXPECT_EQ(again.info.samples, 5U);
  EXPECT_NE(again.identity, first.identity);
  // The cache: the second call finds the first's index (index_cache_path) and agrees with it.
  ::setenv("SOLAR_INDEX_CACHE", dir.file("cache").c_str(), 1);
  const DatasetIndex a = index_dataset(spec, "/label");
  EXPECT_TRUE(fs::exists(index_cache_path(spec, "/label")));
  EXPECT_EQ(index_dataset(spec, "/label").identity, a.identity);
  ::unsetenv("SOLAR_INDEX_CACHE");
}

TEST(DatasetFiles, FilesThatDifferAreRefusedNamingTheFile) {
  TempDir dir;
  put(dir, "m/0.h5", 3, 1);
  put(dir, "m/1.h5", 3, 2, {2, 4, 8});
  std::string e = error_of([&] { open_source(dir.file("m") + ":/data[]"); });
  EXPECT_NE(e.find("m/1.h5 does not match"), std::string::npos) << e;
  EXPECT_NE(e.find("2x4x8"), std::string::npos) << e;
  // Rows of different counts without []: the hint says to add it.
  put(dir, "r/0.h5", 3, 1);
  put(dir, "r/1.h5", 2, 2);
  e = error_of([&] { open_source(dir.file("r") + ":/data"); });
  EXPECT_NE(e.find("put [] after its name"), std::string::npos) << e;
  // Not HDF5, in a glob that takes it: refused, naming it.
  std::ofstream(dir.file("r/2.h5")) << "plain text, not HDF5\n";
  e = error_of([&] { open_source(dir.file("r") + "/*.h5:/data[]"); });
  EXPECT_NE(e.find("r/2.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("not an HDF5 file"), std::string::npos) << e;
}

TEST(DatasetFiles, AFileReplacedRewrittenOrDeletedAfterTheIndexIsNeverRead) {
  TempDir dir;
  put(dir, "f/0.h5", 3, 1);
  const std::string victim = put(dir, "f/1.h5", 3, 2);
  put(dir, "f/2.h5", 3, 3);
  auto src = open_source(dir.file("f") + ":/data[]");
  const std::uint64_t sb = src->info().sample_bytes;
  std::vector<std::byte> buf(3 * sb);
  const SampleRun second{3, 3}, first{0, 3};
  auto read = [&](SampleRun r) { return error_of([&] { src->read({&r, 1}, buf.data()); }); };
  ASSERT_EQ(read(second), "(no error)");
  // Replaced: another file (same shape, other content) moved over its path.
  put(dir, "other.h5", 3, 99);
  fs::rename(dir.file("other.h5"), victim);
  std::string e = read(second);
  EXPECT_NE(e.find("f/1.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("not the file indexed"), std::string::npos) << e;
  EXPECT_THROW(src->file_set()->check_file(1), StorageError);
  // The other files are still served.
  EXPECT_EQ(read(first), "(no error)");
  EXPECT_TRUE(content::check_sample(1, 0, buf.data(), sb));
  // Rewritten in place (a byte appended) and deleted: likewise.
  const std::string third = dir.file("f/2.h5");
  std::ofstream(third, std::ios::app) << 'x';
  e = read({6, 3});
  EXPECT_NE(e.find("f/2.h5"), std::string::npos) << e;
  fs::remove(dir.file("f/0.h5"));
  e = read(first);
  EXPECT_NE(e.find("f/0.h5"), std::string::npos) << e;
}

TEST(DatasetFiles, ManyFilesFewDescriptors) {
  TempDir dir;
  for (int k = 0; k < 300; ++k) put(dir, fmt::format("n/{:04}.h5", k), 1, 100 + k);
  SourceOptions so;
  so.max_open_files = 2;  // at most two files open at once, whatever io_threads says
  so.io_threads = 16;
  auto src = open_source(dir.file("n") + ":/data", so);
  std::vector<Expect> want;
  for (std::uint64_t k = 0; k < 300; ++k) want.push_back({100 + k, 0});
  expect_samples(*src, want);
}

}  // namespace
}  // namespace solar::storage

namespace solar::storage {
namespace {

// solar-stored exports a dataset of many files as one export: a client reads it by global id,
// plain and --in-memory.
TEST(DatasetFiles, SolarStoredExportsADirectoryAsOneExport) {
  TempDir dir;
  put(dir, "e/0.h5", 4, 31);
  put(dir, "e/1.h5", 2, 32);
  put(dir, "e/2.h5", 3, 33);
  std::vector<Expect> want;
  for (std::uint64_t i = 0; i < 4; ++i) want.push_back({31, i});
  for (std::uint64_t i = 0; i < 2; ++i) want.push_back({32, i});
  for (std::uint64_t i = 0; i < 3; ++i) want.push_back({33, i});
  for (const bool in_memory : {false, true}) {
    std::vector<std::string> args = {"--export", "many=" + dir.file("e") + ":/data[]"};
    if (in_memory) args.push_back("--in-memory");
    test::StoredProcess server(dir, args);
    ASSERT_TRUE(server.start()) << server.log();
    auto src = open_source(server.uri("many"));
    EXPECT_EQ(src->file_set(), nullptr);  // the files are the server's
    expect_samples(*src, want);
  }
}

}  // namespace
}  // namespace solar::storage

namespace solar::storage {
namespace {

// gzip chunks of one sample (issue 36): their stored extents are what the file holds (each one
// inflates to exactly the sample), read_stored hands them back at a stride, the index keeps
// them, and stored_sample_bytes is the longest.
std::vector<std::byte> inflate(const std::byte* in, std::uint64_t len, std::uint64_t out_len) {
  std::vector<std::byte> out(out_len);
  uLongf n = static_cast<uLongf>(out_len);
  EXPECT_EQ(::uncompress(reinterpret_cast<Bytef*>(out.data()), &n,
                         reinterpret_cast<const Bytef*>(in), static_cast<uLong>(len)),
            Z_OK);
  EXPECT_EQ(n, out_len);
  return out;
}

void expect_stored(SampleSource& src, std::uint64_t seed_of_first, bool one_file) {
  const std::uint64_t sb = src.info().sample_bytes, n = src.info().samples;
  const std::uint64_t stride = stored_sample_bytes(src);
  ASSERT_GT(stride, 0u) << "no stored extents found";
  std::uint64_t longest = 0;
  for (const DatasetFile& f : src.file_set()->files()) {
    ASSERT_TRUE(f.stored() && !f.raw()) << f.path;
    for (std::uint64_t len : f.stored_lengths) longest = std::max(longest, len);
  }
  EXPECT_EQ(stride, longest);
  const std::vector<SampleRun> runs = {{n - 2, 2}, {0, n - 2}};
  std::vector<std::byte> got(n * stride, std::byte{0x55});
  src.read_stored(runs, got.data(), stride);
  std::uint64_t i = 0;
  for (const SampleRun& r : runs)
    for (std::uint64_t g = r.first; g < r.first + r.count; ++g, ++i) {
      // Which file and which of its samples g is: the extents say how long it is as stored.
      const DatasetFile* f = nullptr;
      for (const DatasetFile& x : src.file_set()->files())
        if (g >= x.first && g < x.first + x.count) f = &x;
      ASSERT_NE(f, nullptr);
      const auto [off, len] = f->stored_extent(g - f->first, sb);
      const std::byte* at = got.data() + i * stride;
      const auto sample = inflate(at, len, sb);
      const std::uint64_t seed = one_file ? seed_of_first : seed_of_first + g;
      const std::uint64_t local = one_file ? g : 0;
      EXPECT_TRUE(content::check_sample(seed, local, sample.data(), sb)) << "sample " << g;
      for (std::uint64_t k = len; k < stride; ++k)
        ASSERT_EQ(at[k], std::byte{0}) << "sample " << g << ": the stride's rest is not zeroed";
    }
  std::vector<std::byte> small(stride - 1);
  const SampleRun one{0, 1};
  if (src.file_set()->files()[0].stored_lengths[0] == stride) {
    EXPECT_NE(error_of([&] { src.read_stored({&one, 1}, small.data(), stride - 1); })
                  .find("more than"),
              std::string::npos);
  }
}

TEST(DatasetFiles, GzipChunksOfOneSampleAreReadAsStored) {
  TempDir dir;
  GenSpec s;
  s.path = dir.file("gz.h5");
  s.samples = 12;
  s.shape = kShape;
  s.seed = 21;
  s.layout = Layout::gzip;
  write_dataset(s);
  SourceOptions so;
  auto one = open_source(s.path, so);
  expect_stored(*one, 21, true);
  // A raw file has no stored extents: stored_sample_bytes 0, read_stored its raw samples.
  GenSpec raw = s;
  raw.path = dir.file("raw.h5");
  raw.layout = Layout::contiguous;
  write_dataset(raw);
  auto r = open_source(raw.path, so);
  EXPECT_EQ(stored_sample_bytes(*r), 0u);
  std::vector<std::byte> b(2 * 64);
  const SampleRun two{3, 2};
  r->read_stored({&two, 1}, b.data(), 64);
  EXPECT_TRUE(content::check_sample(21, 3, b.data(), 64));
  EXPECT_TRUE(content::check_sample(21, 4, b.data() + 64, 64));
}

TEST(DatasetFiles, AFolderOfGzipFilesKeepsItsStoredExtentsInTheIndex) {
  TempDir dir;
  for (int i = 0; i < 6; ++i) {  // one sample a file, each file its own seed
    GenSpec s;
    s.path = dir.file(fmt::format("d/f{}.h5", i));
    fs::create_directories(fs::path(s.path).parent_path());
    s.samples = 1;
    s.shape = kShape;
    s.seed = 40 + static_cast<std::uint64_t>(i);
    s.layout = Layout::gzip;
    write_dataset(s);
  }
  const std::string spec = dir.file("d") + ":/data[]";
  DatasetIndex x = index_dataset(spec, "/label");
  const std::string at = dir.file("d.index");
  write_index(x, at);
  DatasetIndex back = read_index(at, spec, "/label");
  ASSERT_EQ(back.files.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(back.files[i].stored_offsets, x.files[i].stored_offsets);
    EXPECT_EQ(back.files[i].stored_lengths, x.files[i].stored_lengths);
    EXPECT_TRUE(back.files[i].stored());
  }
  SourceOptions so;
  auto src = open_files_source(std::move(back), so);
  expect_stored(*src, 40, false);
}

// Whole-file samples (issue 36): a glob or list of files that are not HDF5 names one sample a
// file, its bytes as they are, of its own size; only read_stored reads them.
TEST(DatasetFiles, FilesThatAreNotHdf5AreWholeFileSamplesOfTheirOwnSizes) {
  TempDir dir;
  fs::create_directories(dir.file("npz"));
  std::vector<std::string> bytes;
  for (int i = 0; i < 5; ++i) {
    std::string b(100 + 37 * i, '\0');
    for (std::size_t k = 0; k < b.size(); ++k) b[k] = static_cast<char>('a' + (i * 7 + k) % 26);
    std::ofstream(dir.file(fmt::format("npz/s{}.npz", i)), std::ios::binary) << b;
    bytes.push_back(b);
  }
  const std::string spec = dir.file("npz") + "/*.npz";
  DatasetIndex x = index_dataset(spec, "/label");
  EXPECT_TRUE(x.whole_files);
  EXPECT_TRUE(x.info.whole_files);
  ASSERT_EQ(x.info.samples, 5u);
  EXPECT_EQ(x.info.sample_bytes, 100u + 37 * 4);  // the largest
  EXPECT_FALSE(x.info.has_labels);
  EXPECT_NE(x.info.layout.find("whole-file samples of 100 to 248 bytes"), std::string::npos)
      << x.info.layout;
  // The index file keeps them, and a version-3 index says so.
  const std::string at = dir.file("npz.index");
  write_index(x, at);
  {
    std::ifstream in(at);
    std::string head;
    std::getline(in, head);
    EXPECT_EQ(head, "solar-dataset-index 3");
  }
  DatasetIndex back = read_index(at, spec, "/label");
  EXPECT_TRUE(back.whole_files && back.info.whole_files);
  EXPECT_EQ(back.identity, x.identity);
  auto src = open_files_source(std::move(back), SourceOptions{});
  EXPECT_EQ(stored_sample_bytes(*src), 248u);
  // Each file's bytes at the stride, zero-padded; in any order.
  const std::uint64_t stride = 256;
  std::vector<std::byte> out(5 * stride, std::byte{0xff});
  const SampleRun runs[] = {{3, 2}, {0, 3}};
  src->read_stored(runs, out.data(), stride);
  const int order[] = {3, 4, 0, 1, 2};
  for (int j = 0; j < 5; ++j) {
    const std::string& want = bytes[static_cast<std::size_t>(order[j])];
    const auto* got = reinterpret_cast<const char*>(out.data() + j * stride);
    EXPECT_EQ(std::string(got, want.size()), want) << "sample " << order[j];
    for (std::size_t k = want.size(); k < stride; ++k) ASSERT_EQ(got[k], '\0');
  }
  // read() refuses: rows of one size; whole files are read as stored (their own lengths).
  std::vector<std::byte> dec(5 * 248);
  const SampleRun all{0, 5};
  const std::string why = error_of([&] { src->read({&all, 1}, dec.data()); });
  EXPECT_NE(why.find("whole-file samples"), std::string::npos) << why;
  EXPECT_NE(why.find("--transparent"), std::string::npos) << why;
  EXPECT_NE(why.find("read_stored"), std::string::npos) << why;
}

TEST(DatasetFiles, WholeFileRefusalsNameTheFile) {
  TempDir dir;
  fs::create_directories(dir.file("w"));
  std::ofstream(dir.file("w/a.bin")) << "abc";
  std::ofstream(dir.file("w/b.bin")).flush();  // empty
  std::string why = error_of([&] { scan_dataset(dir.file("w") + "/*.bin", ""); });
  EXPECT_NE(why.find("b.bin is empty"), std::string::npos) << why;
  // With :/name the files are taken for HDF5 (and refused as not HDF5), not as whole files.
  fs::remove(dir.file("w/b.bin"));
  why = error_of([&] { scan_dataset(dir.file("w") + "/*.bin:/data", ""); });
  EXPECT_NE(why.find("a.bin"), std::string::npos) << why;
  EXPECT_EQ(why.find("whole-file"), std::string::npos) << why;
  // An HDF5 file first: the glob is an HDF5 dataset as before (not whole files).
  put(dir, "h/x.h5", 3, 9);
  DatasetIndex h = scan_dataset(dir.file("h") + "/*", "/label");
  EXPECT_FALSE(h.whole_files);
  EXPECT_EQ(h.info.samples, 1u);  // without [] the file's whole array is one sample
  // A directory lists HDF5 files only: one of other files says to name them with a glob.
  why = error_of([&] { scan_dataset(dir.file("w") + "/", ""); });
  EXPECT_NE(why.find("named by a glob"), std::string::npos) << why;
}

}  // namespace
}  // namespace solar::storage

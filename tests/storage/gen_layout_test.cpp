// SPDX-License-Identifier: Apache-2.0
// solar gen's layouts without the command line: the files each makes and their order, the
// reader's spec, labels of any dtype (content.h's fill_label), and what a failed or forced write
// leaves. tests/storage/test_gen_layouts.py reads the files back with h5py.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "solar/storage/content.h"
#include "solar/storage/hdf5_writer.h"
#include "test_util.h"

namespace solar::storage {
namespace {
using test::TempDir;
namespace fs = std::filesystem;

GenSpec spec_of(FilesLayout files, std::uint64_t samples) {
  GenSpec s;
  s.files = files;
  s.samples = samples;
  s.path = "out";
  s.shape = {2, 4};
  return s;
}

TEST(GenLayout, PerSampleFilesSortInGlobalOrderAtEveryWidth) {
  // 70,000 samples: 1,094 universes of 64 samples, in 18 folders of 64 universes.
  GenSpec s = spec_of(FilesLayout::per_sample_files, 70'000);
  const auto files = gen_files(s);
  ASSERT_EQ(files.size(), 70'000u);
  EXPECT_EQ(files[0].path, "000/univ0000_000.hdf5");
  EXPECT_EQ(files[64].path, "000/univ0001_000.hdf5");
  EXPECT_EQ(files[4096].path, "001/univ0064_000.hdf5");
  EXPECT_EQ(files.back().path, "017/univ1093_047.hdf5");
  for (std::size_t g = 0; g < files.size(); ++g) {
    ASSERT_EQ(files[g].first, g);
    ASSERT_EQ(files[g].count, 1u);
    if (g) {
      ASSERT_LT(files[g - 1].path, files[g].path) << g;
    }
  }
  // Past 9,999 universes the names widen, all of them: still sorted.
  s.samples = 64 * 10'001;
  s.universes_per_dir = 1000;
  const auto wide = gen_files(s);
  EXPECT_EQ(wide[0].path, "000/univ00000_000.hdf5");
  EXPECT_EQ(wide.back().path, "010/univ10000_063.hdf5");
  EXPECT_TRUE(std::is_sorted(wide.begin(), wide.end(),
                             [](const auto& a, const auto& b) { return a.path < b.path; }));
}

TEST(GenLayout, DlioDividesSamplesWithTheLastFileShorter) {
  GenSpec s = spec_of(FilesLayout::dlio, 380);
  s.file_count = 8;
  s.samples_per_file = 50;
  auto files = gen_files(s);
  ASSERT_EQ(files.size(), 8u);
  EXPECT_EQ(files[0].path, "img_0_of_8.hdf5");
  EXPECT_EQ(files[7].path, "img_7_of_8.hdf5");
  EXPECT_EQ(files[7].first, 350u);
  EXPECT_EQ(files[7].count, 30u);
  // --files alone: the samples divided, rounded up; names padded as DLIO pads them.
  s.samples_per_file = 0;
  s.file_count = 12;
  s.samples = 130;
  files = gen_files(s);
  ASSERT_EQ(files.size(), 12u);
  EXPECT_EQ(files[0].path, "img_00_of_12.hdf5");
  EXPECT_EQ(files[0].count, 11u);
  EXPECT_EQ(files[11].count, 9u);
  // --samples-per-file alone: as many files as it takes.
  s.file_count = 0;
  s.samples_per_file = 100;
  files = gen_files(s);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[1].count, 30u);
  // 9 samples over 4 files of 3 would leave the last one empty: refused, naming the fix.
  s.samples = 9;
  s.samples_per_file = 2;
  s.file_count = 4;
  try {
    gen_files(s);
    ADD_FAILURE() << "9 samples in 4 files of 2";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("give --samples in 7..8"), std::string::npos) << e.what();
  }
  s.samples_per_file = 0;
  s.samples = 3;
  EXPECT_THROW(gen_files(s), StorageError);  // 4 files for 3 samples
}

TEST(GenLayout, TheReaderSpecNamesTheArrayAndRows) {
  GenSpec s = spec_of(FilesLayout::per_sample_files, 1);
  EXPECT_EQ(dataset_spec(s), "out/:/split");
  EXPECT_EQ(gen_arrays(s).labels, "/unitPar");
  EXPECT_EQ(gen_arrays(s).label_bytes(), 16u);
  s.files = FilesLayout::deepcam;
  s.shape = {12, 16, 4};
  EXPECT_EQ(dataset_spec(s), "out/:/climate/data");
  EXPECT_EQ(gen_arrays(s).label_shape, (std::vector<std::uint64_t>{12, 16}));
  s.files = FilesLayout::dlio;
  s.path = "out/";
  EXPECT_EQ(dataset_spec(s), "out/:/records[]");
  EXPECT_EQ(gen_arrays(s).label_bytes(), 8u);
  s.files = FilesLayout::single;
  s.path = "one.h5";
  EXPECT_EQ(dataset_spec(s), "one.h5");
}

TEST(GenContent, LabelsOfAnyDtypeFollowOneRule) {
  for (std::uint64_t id : {0ull, 1ull, 42ull, 1ull << 40}) {
    // An int32 of 4 bytes is label(); an int64 the same value; a uint8 its low byte.
    std::int32_t i32;
    content::fill_label(3, id, DType::int32, reinterpret_cast<std::byte*>(&i32), 4);
    EXPECT_EQ(i32, content::label(3, id));
    std::int64_t i64[2];
    content::fill_label(3, id, DType::int64, reinterpret_cast<std::byte*>(i64), 16);
    EXPECT_EQ(i64[0], content::label(3, id));
    EXPECT_GE(i64[1], 0);
    EXPECT_NE(i64[1], i64[0]);
    std::uint8_t u8;
    content::fill_label(3, id, DType::uint8, reinterpret_cast<std::byte*>(&u8), 1);
    EXPECT_EQ(u8, static_cast<std::uint8_t>(content::label(3, id)));
    // Floats in [0, 1), exact: unitPar's four values.
    float f[4];
    content::fill_label(3, id, DType::float32, reinterpret_cast<std::byte*>(f), 16);
    for (float x : f) {
      EXPECT_GE(x, 0.0f);
      EXPECT_LT(x, 1.0f);
      EXPECT_EQ(x * 0x1p24f, static_cast<float>(static_cast<std::uint32_t>(x * 0x1p24f)));
    }
    EXPECT_TRUE(content::check_label(3, id, DType::float32, reinterpret_cast<std::byte*>(f), 16));
    EXPECT_FALSE(content::check_label(4, id, DType::float32, reinterpret_cast<std::byte*>(f), 16));
    EXPECT_FALSE(
        content::check_label(3, id + 1, DType::float32, reinterpret_cast<std::byte*>(f), 16));
    double d;
    content::fill_label(3, id, DType::float64, reinterpret_cast<std::byte*>(&d), 8);
    EXPECT_GE(d, 0.0);
    EXPECT_LT(d, 1.0);
  }
  // Every byte counts, the bytes past the last whole element too.
  std::vector<std::byte> mask(12 * 16 * 4 + 3);
  content::fill_label(9, 5, DType::int32, mask.data(), mask.size());
  EXPECT_TRUE(content::check_label(9, 5, DType::int32, mask.data(), mask.size()));
  for (std::size_t at : {std::size_t{0}, mask.size() / 2, mask.size() - 1}) {
    auto bad = mask;
    bad[at] ^= std::byte{1};
    EXPECT_FALSE(content::check_label(9, 5, DType::int32, bad.data(), bad.size())) << at;
  }
}

TEST(GenWrite, ADirectoryAppearsWholeAndForceReplacesOnlyHdf5) {
  TempDir dir;
  GenSpec s = spec_of(FilesLayout::dlio, 10);
  s.path = dir.file("dlio");
  s.file_count = 3;
  std::uint64_t last = 0;
  write_dataset(s, [&](std::uint64_t done, std::uint64_t total) {
    EXPECT_EQ(total, 10u);
    EXPECT_GT(done, last);
    last = done;
    // Until the end, the dataset is not where it goes.
    EXPECT_FALSE(fs::exists(s.path));
  });
  EXPECT_EQ(last, 10u);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"dlio"});
  EXPECT_TRUE(fs::is_regular_file(s.path + "/img_2_of_3.hdf5"));

  EXPECT_THROW(write_dataset(s), StorageError);  // exists, no force
  s.force = true;
  s.file_count = 2;
  write_dataset(s);
  EXPECT_FALSE(fs::exists(s.path + "/img_2_of_3.hdf5"));
  EXPECT_TRUE(fs::is_regular_file(s.path + "/img_1_of_2.hdf5"));

  std::ofstream(s.path + "/README") << "mine\n";
  try {
    write_dataset(s);
    ADD_FAILURE() << "replaced a folder holding a README";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("README"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::exists(s.path + "/README"));
  names.clear();
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"dlio"});  // no temporary left
}

}  // namespace
}  // namespace solar::storage

// SPDX-License-Identifier: Apache-2.0
// What a dataset spec names: `FILE[:/DATASET]` (an HDF5 file and the dataset in it) or
// `fabric://HOST:PORT/NAME` (an export of solar-stored). Every C++ reader of a spec parses it
// here: the storage sources (open_source), solar-stored's --export NAME=FILE[:/DATASET]. Two
// copies stay, each in a language this target cannot serve, and are tested against the same
// table (tests/protocol/dataset_spec_cases.json): the interposer's (interpose/src/preload.c,
// plain C) and the Python package's (python/solar/dataset.py).
#pragma once

#include <string>
#include <string_view>

namespace solar::protocol {

// FILE[:/DATASET] split at the last ":/" after the first character (a file name may hold
// colons; the dataset starts with its "/"); without one, the whole spec is the file and the
// dataset is /data. No check of the file or of a scheme.
struct FileDataset {
  std::string file;
  std::string dataset;
  bool operator==(const FileDataset&) const = default;
};
FileDataset split_file_dataset(std::string_view spec);

struct DatasetSpec {
  enum class Kind {
    file,            // FILE[:/DATASET]: file and dataset set (FILE may be a directory: a
                     // dataset of many files, told apart only by stat)
    fabric,          // fabric://...: the whole spec is the source's address
    unknown_scheme,  // SCHEME://... other than fabric://
    no_file,         // empty
  };
  Kind kind = Kind::file;
  FileDataset where;  // Kind::file only; `[]` taken off the dataset (rows)
  // Kind::file: many files named without a stat: `@LIST` (where.file is the list, without the
  // @), or a glob (`*`, `?` or `[` in where.file).
  bool list = false, glob = false;
  // The dataset ended with `[]`: its first dimension indexes samples in every file.
  bool rows = false;
};
// A source's spec, as open_source reads it: fabric:// first, then any other "://" refused,
// then FILE[:/DATASET] (an empty file refused).
DatasetSpec parse_dataset_spec(std::string_view spec);

}  // namespace solar::protocol

// SPDX-License-Identifier: Apache-2.0
#include "solar/dataset_spec.h"

namespace solar::protocol {

FileDataset split_file_dataset(std::string_view spec) {
  if (const auto pos = spec.rfind(":/"); pos != std::string_view::npos && pos > 0)
    return {std::string(spec.substr(0, pos)), std::string(spec.substr(pos + 1))};
  return {std::string(spec), "/data"};
}

DatasetSpec parse_dataset_spec(std::string_view spec) {
  using Kind = DatasetSpec::Kind;
  if (spec.starts_with("fabric://")) return {Kind::fabric, {}};
  if (spec.find("://") != std::string_view::npos) return {Kind::unknown_scheme, {}};
  DatasetSpec d{Kind::file, split_file_dataset(spec)};
  if (d.where.dataset.ends_with("[]")) {
    d.rows = true;
    d.where.dataset.resize(d.where.dataset.size() - 2);
  }
  if (d.where.file.starts_with("@")) {
    d.list = true;
    d.where.file.erase(0, 1);
  } else {
    d.glob = d.where.file.find_first_of("*?[") != std::string::npos;
  }
  if (d.where.file.empty()) return {Kind::no_file, {}};
  return d;
}

}  // namespace solar::protocol

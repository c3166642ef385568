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
  FileDataset where = split_file_dataset(spec);
  if (where.file.empty()) return {Kind::no_file, {}};
  return {Kind::file, std::move(where)};
}

}  // namespace solar::protocol

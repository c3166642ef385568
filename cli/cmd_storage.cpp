// SPDX-License-Identifier: Apache-2.0
// solar gen, verify, bench io (each in its own file: cmd_gen.cpp, cmd_verify.cpp,
// cmd_bench_io.cpp) and solar dataset-info, registered on the app.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cmd_storage.h"
#include "commands.h"
#include "options.h"
#include "solar/storage/dataset_files.h"
#include "solar/storage/sample_source.h"

namespace solar::cli {

void add_storage_commands(CLI::App& app) {
  add_gen_command(app);
  add_verify_command(app);

  // What the SPANK plugin needs from a dataset, read in this separate process so that the
  // plugin itself never loads HDF5, MPI or libfabric into srun or slurmstepd.
  struct InfoOptions {
    std::string source, labels = "/label", provider, index_out;
  };
  auto in = std::make_shared<InfoOptions>();
  CLI::App* info = app.add_subcommand(
      "dataset-info",
      "Print a dataset's shape and identity as one JSON line: samples, sample_bytes, "
      "stored_sample_bytes (filtered chunks of one sample: the longest as stored, what the "
      "transparent mode buffers; else 0), stored_sizes (only when those differ: each sample's "
      "bytes as stored, by global id), label_bytes (0: no labels), whole_files (every file one "
      "sample: the transparent mode only), shape, dtype, layout, "
      "identity. Exit code 2 with one line "
      "naming the problem when it cannot be read. Used by the Slurm plugin.");
  info->add_option("source", in->source, "FILE.h5:/dataset (default /data) or fabric://HOST:PORT/NAME")
      ->type_name(kSource)
      ->required();
  info->add_option("--labels", in->labels, "Labels dataset ('' for none) [/label]")
      ->type_name("PATH");
  info->add_option("--provider", in->provider, "libfabric provider for fabric:// sources")
      ->type_name("NAME");
  info->add_option("--index-out", in->index_out,
                   "A dataset of many files: also write its index here (agents and ranks read it "
                   "instead of listing and checking every file); nothing is written for one file")
      ->type_name(kFile);
  info->callback([in] {
    storage::SourceOptions so;
    so.label_dataset = in->labels;
    so.provider = in->provider;
    try {
      std::unique_ptr<storage::SampleSource> src;
      if (storage::names_many_files(in->source)) {
        storage::DatasetIndex index = storage::index_dataset(in->source, in->labels);
        if (!in->index_out.empty()) storage::write_index(index, in->index_out);
        src = storage::open_files_source(std::move(index), so);
      } else {
        src = storage::open_source(in->source, so);
      }
      const auto& i = src->info();
      const auto* files = src->file_set();
      // Samples of differing sizes as stored (whole files, filtered chunks): each one's, for
      // the transparent mode's plan by bytes (solar run does the same, cmd_run.cpp).
      const std::vector<std::uint64_t> sizes = storage::stored_sample_sizes(*src);
      nlohmann::json doc{{"samples", i.samples},
                         {"files", files ? files->files().size() : 0},
                         {"sample_bytes", i.sample_bytes},
                         // the transparent mode's slot over filtered chunks
                         {"stored_sample_bytes",
                          storage::stored_sample_bytes(*src)},
                         {"label_bytes", i.has_labels ? i.label_bytes : 0},
                         {"whole_files", i.whole_files},
                         {"shape", i.shape_string()},
                         {"dtype", std::string(storage::to_string(i.dtype))},
                         {"layout", i.layout},
                         {"identity", src->identity()}};
      if (!sizes.empty()) doc["stored_sizes"] = sizes;
      fmt::print("{}\n", doc.dump());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      exit_code() = kExitUsage;
    }
  });

  CLI::App* bench = app.add_subcommand("bench", "Benchmarks.");
  bench->require_subcommand(1);
  add_bench_io_command(*bench);
}

}  // namespace solar::cli

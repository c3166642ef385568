// SPDX-License-Identifier: Apache-2.0
// Runs under mpirun: every rank opens the dataset through MPI-IO (Hdf5Options::mpio), reads a
// strided share of the samples as coalesced runs (independent or collective transfers) and
// checks every byte and label against the generator. Exit 0 only if every rank read right.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "solar/storage/content.h"
#include "solar/storage/hdf5_source.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long bad = 0, checked = 0;
  if (argc != 3) {
    if (rank == 0) std::fprintf(stderr, "usage: %s FILE.h5 independent|collective\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  try {
    solar::storage::Hdf5Options o;
    o.mpio = true;
    o.collective = std::string(argv[2]) == "collective";
    auto src = solar::storage::Hdf5Source::open(argv[1], "/data", o);
    const auto& info = src->info();
    const std::uint64_t seed = info.seed.value_or(0);
    // Rank r reads blocks of 3 consecutive samples, every size-th block: runs of 3. Every rank
    // makes the same number of read calls (collective transfers need that).
    const std::uint64_t blocks = info.samples / 3;
    const std::uint64_t calls = (blocks + size - 1) / size;
    std::vector<std::byte> buf(3 * info.sample_bytes), labels(3 * info.label_bytes);
    for (std::uint64_t c = 0; c < calls; ++c) {
      const std::uint64_t blk = c * size + rank;
      std::vector<solar::storage::SampleRun> runs;
      if (blk < blocks) runs.push_back({blk * 3, 3});
      if (!runs.empty() || o.collective) src->read(runs, buf.data());
      if (!runs.empty() && info.has_labels) src->read_labels(runs, labels.data());
      for (std::uint64_t i = 0; i < (runs.empty() ? 0 : 3); ++i) {
        const std::uint64_t idx = blk * 3 + i;
        bool ok = solar::storage::content::check_sample(
            seed, idx, buf.data() + i * info.sample_bytes, info.sample_bytes);
        if (ok && info.label_bytes == 4) {
          std::int32_t l;
          std::memcpy(&l, labels.data() + i * 4, 4);
          ok = l == solar::storage::content::label(seed, idx);
        }
        bad += !ok;
        ++checked;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    bad += 1000000;
  }
  long total_bad = 0, total = 0;
  MPI_Allreduce(&bad, &total_bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&checked, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("MPI-IO (%s, %d ranks): %ld samples checked, %ld wrong\n", argv[2], size, total,
                total_bad);
  MPI_Finalize();
  return total_bad == 0 && total > 0 ? 0 : 1;
}

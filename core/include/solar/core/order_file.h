// SPDX-License-Identifier: Apache-2.0
// The script's own order (issue 38), given as a file: `solar run --order-file F`,
// `srun --solar-order-file=F`. A script that computes its whole order up front (the SOLAR
// artifact's per-epoch shuffle lists, broadcast over MPI and read with
// DistributedSampler(shuffle=False)) writes it once, e.g.
//
//     np.save("order.npy", np.stack([rng.permutation(N) for e in range(E)]))
//
// and solar plans exactly that order: epoch e's global sequence is row e, cut into steps and
// strided among the ranks as DistributedSampler(shuffle=False) does over indices 0..N-1 (rank r
// takes positions r, r+W, ...; padded by wrapping to a multiple of W unless drop_last).
//
// Formats: `.npy` (NumPy's format 1.0-3.0: a C-order array of little-endian integers, int32,
// int64, uint32 or uint64, of shape (E, N) or (E·N,)); anything else is text, sample ids
// separated by white space or commas (say, one per line, epoch after epoch). Each epoch's N ids
// must be a permutation of 0..N-1; a file of more epochs than the run's gives its first ones.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace solar {

// Epochs × samples ids, epoch e at [e·samples, (e+1)·samples). Throws ConfigError naming
// --order-file and what is wrong (the file, its format, its shape against the run's, the first
// id out of range or repeated, with its epoch and position).
std::shared_ptr<const std::vector<std::uint32_t>> read_order_file(const std::string& path,
                                                                  std::uint64_t samples,
                                                                  std::uint32_t epochs);

// `c` follows the order file at `path`: order `file`, its list read for c.samples and c.epochs,
// the config validated. Throws ConfigError as read_order_file does.
struct PlanConfig;
void follow_order_file(PlanConfig& c, const std::string& path);

}  // namespace solar

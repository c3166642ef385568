// SPDX-License-Identifier: Apache-2.0
// Portable random number generators for shuffled epoch orders.
//
// Every generator here is specified bit for bit so that a plan computed on one machine equals
// the plan computed on any other (compiler, standard library, CPU). That is why solar never uses
// std::shuffle or std::*_distribution: their output is implementation-defined.
#pragma once

#include <cstdint>
#include <span>

namespace solar {

// SplitMix64 (Steele, Lea, Flood 2014; the seeding generator recommended for xoshiro).
// Used to derive independent per-epoch seeds from (seed, epoch).
std::uint64_t splitmix64(std::uint64_t& state);

// xoshiro256** 1.0 (Blackman & Vigna 2018), state seeded by four SplitMix64 outputs.
class Xoshiro256 {
 public:
  explicit Xoshiro256(std::uint64_t seed);
  std::uint64_t next();
  // Unbiased integer in [0, bound) by Lemire's multiply-and-reject method
  // ("Fast random integer generation in an interval", 2019). bound must be > 0.
  std::uint64_t bounded(std::uint64_t bound);

 private:
  std::uint64_t s_[4];
};

// MT19937 (Matsumoto & Nishimura 1998), 32-bit outputs, standard init_genrand seeding with the
// low 32 bits of the seed: the engine behind torch.Generator on the CPU.
class Mt19937 {
 public:
  explicit Mt19937(std::uint64_t seed);
  std::uint32_t next();

 private:
  void twist();
  std::uint32_t mt_[624];
  int index_;
};

// solar's own order: Fisher–Yates over xoshiro256** seeded with splitmix64(seed ⊕ epoch key).
// out.size() is n; out receives a permutation of 0..n-1.
void solar_permutation(std::uint64_t seed, std::uint64_t epoch, std::span<std::uint32_t> out);

// torch.randperm(n, generator=g) after g.manual_seed(seed) on the CPU (PyTorch 1.13 algorithm:
// for i in 0..n-2: z = mt() % (n-i); swap(r[i], r[i+z])). The modulo bias is PyTorch's; we
// reproduce it on purpose.
void torch_randperm(std::uint64_t seed, std::span<std::uint32_t> out);

}  // namespace solar

// SPDX-License-Identifier: Apache-2.0
#include "solar/core/order.h"

#include <algorithm>

#include "solar/core/rng.h"

namespace solar {

EpochLayout EpochLayout::of(const PlanConfig& c) {
  EpochLayout l;
  l.world = c.world();
  l.batch = c.batch;
  const std::uint64_t n = c.samples, w = l.world;
  // torch/utils/data/distributed.py: num_samples.
  if (c.drop_last && n % w != 0) l.per_rank = (n - w + w - 1) / w;
  else l.per_rank = (n + w - 1) / w;
  if (c.drop_last) {
    l.steps = static_cast<std::uint32_t>(l.per_rank / c.batch);
    l.last_batch = c.batch;
  } else {
    l.steps = static_cast<std::uint32_t>((l.per_rank + c.batch - 1) / c.batch);
    l.last_batch = static_cast<std::uint32_t>(l.per_rank - std::uint64_t{l.steps - 1} * c.batch);
  }
  return l;
}

void epoch_sequence(const PlanConfig& c, const EpochLayout& layout, std::uint32_t epoch,
                    std::vector<std::uint32_t>& out) {
  const std::uint64_t n = c.samples, total = layout.sequence_length();
  out.resize(std::max(n, total));
  std::span<std::uint32_t> perm(out.data(), n);
  if (c.order == OrderMode::file) {
    if (!c.order_list || c.order_list->size() < (std::uint64_t{epoch} + 1) * n)
      throw ConfigError("--order-file",
                        "this plan follows an order file, and the order is not at hand (a plan "
                        "file holds its accesses, not the list): give the order file again");
    const auto first = c.order_list->begin() + static_cast<std::ptrdiff_t>(std::uint64_t{epoch} * n);
    std::copy(first, first + static_cast<std::ptrdiff_t>(n), perm.begin());
  } else if (c.order == OrderMode::torch) {
    torch_randperm(c.seed + epoch, perm);
  } else {
    solar_permutation(c.seed, epoch, perm);
  }
  // Pad by wrapping around the permutation, as DistributedSampler does; or truncate.
  for (std::uint64_t i = n; i < total; ++i) out[i] = out[(i - n) % n];
  out.resize(total);
}

std::uint64_t distinct_per_epoch(const PlanConfig& c, const EpochLayout& layout) {
  return std::min<std::uint64_t>(c.samples, layout.used());
}

std::uint64_t lower_bound_fetches(const PlanConfig& c) {
  const EpochLayout layout = EpochLayout::of(c);
  const std::uint64_t u = distinct_per_epoch(c, layout);
  // The bound is the same for every policy: it is what the configured buffers allow. With sized
  // samples a buffer holds at most as many as its bytes take of the smallest ones.
  std::uint64_t per_buffer = c.buffer_samples() + c.local_samples();  // both tiers
  if (c.sized()) {
    std::vector<std::uint64_t> s = *c.sample_sizes;
    std::sort(s.begin(), s.end());
    std::uint64_t bytes = 0;
    per_buffer = 0;
    while (per_buffer < s.size() && bytes + s[per_buffer] <= c.buffer_bytes)
      bytes += s[per_buffer++];
  }
  const std::uint64_t held = std::uint64_t{c.nodes} * per_buffer;
  const std::uint64_t per_epoch = u > held ? u - held : 0;
  return u + std::uint64_t{c.epochs - 1} * per_epoch;
}

namespace {
__extension__ typedef unsigned __int128 u128;  // GCC and Clang; -Wpedantic knows it this way
// Bytes over many epochs can pass 2^64 (10^6 epochs of 2^62 bytes): counted to the limit.
std::uint64_t saturated(u128 v) {
  return v > ~std::uint64_t{0} ? ~std::uint64_t{0} : static_cast<std::uint64_t>(v);
}
}  // namespace

std::uint64_t lower_bound_bytes(const PlanConfig& c) {
  if (!c.sized()) return saturated(static_cast<u128>(lower_bound_fetches(c)) * c.sample_bytes);
  // Every epoch reads every sample it uses (all of them, or all but the N - U that drop_last
  // cuts: at most the largest ones), and at most the nodes' buffers' bytes can already be there.
  const EpochLayout layout = EpochLayout::of(c);
  const std::uint64_t u = distinct_per_epoch(c, layout);
  std::vector<std::uint64_t> s = *c.sample_sizes;
  std::sort(s.begin(), s.end());
  std::uint64_t epoch_bytes = 0;
  for (std::uint64_t i = 0; i < u; ++i) epoch_bytes += s[i];
  const u128 held = static_cast<u128>(c.nodes) * c.buffer_bytes;
  const u128 per_epoch = epoch_bytes > held ? epoch_bytes - held : 0;
  return saturated(epoch_bytes + static_cast<u128>(c.epochs - 1) * per_epoch);
}

}  // namespace solar

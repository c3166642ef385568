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
  if (c.order == OrderMode::torch) torch_randperm(c.seed + epoch, perm);
  else solar_permutation(c.seed, epoch, perm);
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
  // The bound is the same for every policy: it is what the configured buffers allow.
  const std::uint64_t held = std::uint64_t{c.nodes} * c.buffer_samples();
  const std::uint64_t per_epoch = u > held ? u - held : 0;
  return u + std::uint64_t{c.epochs - 1} * per_epoch;
}

}  // namespace solar

// SPDX-License-Identifier: Apache-2.0
// A thin C++ layer over solar.h: RAII loader and batch, exceptions instead of return codes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "solar/solar.h"

namespace solar {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Batch {
 public:
  Batch(solar_loader* l, solar_batch* b) : loader_(l), batch_(b) {}
  Batch(Batch&& o) noexcept : loader_(o.loader_), batch_(std::exchange(o.batch_, nullptr)) {}
  Batch& operator=(Batch&&) = delete;
  // Releases the batch; never throws (a destructor that throws ends in std::terminate). A
  // release that fails here leaves the step held, so the loader's next() reports it.
  ~Batch() {
    if (batch_) solar_release(loader_, std::exchange(batch_, nullptr));
  }

  std::size_t size() const { return solar_batch_size(batch_); }
  std::uint64_t step() const { return solar_batch_step(batch_); }
  std::uint32_t epoch() const { return solar_batch_epoch(batch_); }
  std::uint64_t index(std::size_t i) const { return solar_batch_index(batch_, i); }
  std::span<const std::byte> sample(std::size_t i) const {
    return {static_cast<const std::byte*>(solar_batch_sample(batch_, i)),
            static_cast<std::size_t>(solar_batch_sample_bytes(batch_, i))};
  }
  // Bytes of all its samples (what gather needs; samples of differing sizes each count their own).
  std::uint64_t bytes() const { return solar_batch_bytes(batch_); }
  const void* label(std::size_t i) const { return solar_batch_label(batch_, i); }
  const solar_batch* raw() const { return batch_; }
  // The samples back to back into `data` (and the labels into `labels`, if not empty): one
  // contiguous batch, e.g. a framework's tensor. Throws Error when a span is too small.
  void gather(std::span<std::byte> data, std::span<std::byte> labels = {}) const {
    if (solar_batch_gather(batch_, data.data(), data.size(),
                           labels.empty() ? nullptr : labels.data(), labels.size()) != 0)
      throw Error(solar_last_error());
  }
  // Loss weight that keeps gradients unbiased when batch sizes differ (δ > 0).
  double weight() const { return double(size()) / solar_batch_mean_size(batch_); }
  // Releases now, reporting a failure (Error); the destructor then does nothing.
  void release() {
    if (batch_ && solar_release(loader_, std::exchange(batch_, nullptr)) != 0)
      throw Error(solar_last_error());
  }

 private:
  solar_loader* loader_;
  solar_batch* batch_;
};

class Loader {
 public:
  // From the environment (see solar.h).
  Loader() : l_(solar_open_env()) {
    if (!l_) throw Error(solar_last_error());
  }
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;
  ~Loader() { solar_close(l_); }

  // The next batch, or nothing when every epoch is done.
  std::optional<Batch> next() {
    solar_batch* b = nullptr;
    const int rc = solar_next_batch(l_, &b);
    if (rc < 0) throw Error(solar_last_error());
    if (rc == 0) return std::nullopt;
    return std::optional<Batch>(std::in_place, l_, b);
  }

  // Resume: the next next() returns global step `global_step` (see solar_skip_to). Forward
  // only; throws Error on a step beyond the end, a step already served, or a batch still held.
  void skip_to(std::uint64_t global_step) {
    if (solar_skip_to(l_, global_step) != 0) throw Error(solar_last_error());
  }
  // The global step next() returns next; save it with a checkpoint (with plan_fingerprint()).
  std::uint64_t position() const { return solar_position(l_); }
  std::uint64_t plan_fingerprint() const { return solar_plan_fingerprint(l_); }
  std::uint32_t batch_per_rank() const { return solar_batch_per_rank(l_); }

  bool using_agent() const { return solar_using_agent(l_) != 0; }
  std::uint32_t epochs() const { return solar_epochs(l_); }
  std::uint32_t steps_per_epoch() const { return solar_steps_per_epoch(l_); }
  std::uint64_t sample_bytes() const { return solar_sample_bytes(l_); }  // the largest if they differ
  bool sample_sizes_differ() const { return solar_sample_sizes_differ(l_) != 0; }
  std::uint64_t label_bytes() const { return solar_label_bytes(l_); }
  std::uint64_t dataset_samples() const { return solar_dataset_samples(l_); }
  // One sample's shape; empty when unknown (and for scalar samples: see solar_sample_shape).
  std::vector<std::uint64_t> sample_shape() const {
    const int n = solar_sample_shape(l_, nullptr, 0);
    std::vector<std::uint64_t> dims(n > 0 ? static_cast<std::size_t>(n) : 0);
    if (n > 0) solar_sample_shape(l_, dims.data(), n);
    return dims;
  }
  std::string sample_dtype() const { return solar_sample_dtype(l_); }  // "" when unknown
  std::string label_dtype() const { return solar_label_dtype(l_); }    // "" when unknown/none
  std::uint32_t rank() const { return solar_rank(l_); }
  std::uint32_t world_size() const { return solar_world_size(l_); }
  solar_loader* get() const { return l_; }

 private:
  solar_loader* l_;
};

}  // namespace solar

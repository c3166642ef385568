// SPDX-License-Identifier: Apache-2.0
// RawFabricReference: the raw fabric under a source, measured as fabtests' fi_rma_bw does.
#include "solar/storage/fabric_reference.h"

#include "fabric_source_impl.h"

namespace solar::storage {

// The session and the server memory it reads, kept from one measure to the next.
struct RawFabricReference::Kept {
  std::unique_ptr<Session> s;
  ReferenceMemory memory = ReferenceMemory::plain;
  std::uint64_t asked = 0, key = 0, base = 0, bytes = 0;
};

RawFabricReference::RawFabricReference(FabricSource& source) : source_(source) {}
RawFabricReference::~RawFabricReference() = default;

FabricReference RawFabricReference::measure(std::span<const FabricRead> reads, unsigned window,
                                            std::span<std::byte> local,
                                            std::uint64_t remote_bytes, ReferenceMemory memory) {
  FabricSource::Impl& im = *source_.impl_;
  FabricReference r;
  window = std::max(1u, window);
  std::uint64_t longest = 1;
  for (const auto& x : reads) longest = std::max(longest, x.len);
  if (local.size() < longest)
    throw StorageError(fmt::format("{}: a {}-byte reference read does not fit its {}-byte "
                                   "destination",
                                   im.remote.uri, longest, local.size()));
  if (memory == ReferenceMemory::exported && !im.exported.rma)
    throw StorageError(fmt::format("{}: the export is read through the server's staging "
                                   "buffer (chunked or compressed), so it has no memory of its "
                                   "own to read the reference from; measure it against plain "
                                   "memory",
                                   im.remote.uri));
  // A session of its own: nothing it does shares a lock, an endpoint or a queue with reads.
  // It is kept for the next measure of the same memory: the server lends its plain memory
  // for as long as a session holds it, and fills it when it lends it (1 GiB: a memset, and a
  // munmap when the session goes). With a session a measure, that work ran on the server's
  // core between each reference and the solar reads measured beside it: solar's reads
  // measured right after a reference came out at 0.66-0.83 of it, and those measured before
  // one at 0.81-1.20 (medians of four invocations; tcp;ofi_rxm, 256 KiB one-sample reads from
  // 8 threads); kept, both orders at 0.94-1.00.
  if (!kept_ || kept_->memory != memory || kept_->asked != remote_bytes) {
    kept_.reset();  // the old session (and the server memory it holds) first
    auto ref = std::make_unique<Kept>();
    ref->s = im.open_session(false, false);
    ref->memory = memory;
    ref->asked = remote_bytes;
    if (memory == ReferenceMemory::exported) {
      ref->key = ref->s->data.key;
      ref->base = ref->s->data.base;
      ref->bytes = im.exported.info.samples * im.exported.info.sample_bytes;
    } else {
      const json reply = im.request(*ref->s, {{"op", "reference"}, {"bytes", remote_bytes}});
      if (!reply.value("ok", false))
        throw StorageError(fmt::format("{}: the server lends no reference buffer: {}",
                                       im.remote.uri,
                                       reply.value("error", std::string("no reason given"))));
      const std::string bad = im.remote.uri + ": the server's reference reply is bad";
      ref->key = wire::count_field(reply.at("key"), bad);
      ref->base = wire::count_field(reply.at("base"), bad);
      ref->bytes = wire::count_field(reply.at("bytes"), bad);
    }
    kept_ = std::move(ref);
  }
  Session* s = kept_->s.get();
  const std::uint64_t key = kept_->key, base = kept_->base, rbytes = kept_->bytes;
  if (longest > rbytes)
    throw StorageError(fmt::format("{}: a {}-byte reference read is longer than the server's "
                                   "{}-byte reference buffer",
                                   im.remote.uri, longest, rbytes));
  // The caller's destination, registered once (FI_MR_LOCAL providers).
  fabric::Region region;
  void* desc = nullptr;
  if (s->ep->local_mr()) {
    region = s->ep->register_memory(local.data(), local.size(), FI_READ);
    desc = region.desc();
  }
  std::vector<fi_context2> ctx(window);
  std::vector<unsigned> free_slots(window);
  for (unsigned i = 0; i < window; ++i) free_slots[i] = window - 1 - i;
  std::uint64_t dpos = 0;
  const auto timeout = std::chrono::duration<double>(im.opt.timeout_s);
  auto fail_cq = [&]() -> StorageError {
    fi_cq_err_entry err{};
    fi_cq_readerr(s->ep->cq(), &err, 0);
    return StorageError(fmt::format("{}: a reference read failed: {}", im.remote.uri,
                                    fabric::error_text(err.err)));
  };
  // Issues `list` and waits for all of it; returns the seconds taken.
  auto run = [&](std::span<const FabricRead> list) {
    std::size_t next = 0, inflight = 0;
    fi_cq_entry entries[16];
    const auto t0 = Clock::now();
    auto last = t0;
    while (next < list.size() || inflight > 0) {
      while (next < list.size() && !free_slots.empty()) {
        const FabricRead& x = list[next];
        std::uint64_t off = x.offset % rbytes;
        if (off + x.len > rbytes) off = rbytes - x.len;
        if (dpos + x.len > local.size()) dpos = 0;
        const ssize_t rc = fi_read(s->ep->ep(), local.data() + dpos, x.len, desc, s->server,
                                   base + off, key, &ctx[free_slots.back()]);
        if (rc == -FI_EAGAIN) break;
        if (rc != 0)
          throw StorageError(
              fmt::format("{}: fi_read failed: {}", im.remote.uri, fabric::error_text(rc)));
        free_slots.pop_back();
        dpos += x.len;
        ++inflight;
        ++next;
      }
      const ssize_t n = fi_cq_read(s->ep->cq(), entries, 16);
      if (n > 0) {
        for (ssize_t i = 0; i < n; ++i)
          free_slots.push_back(
              static_cast<unsigned>(static_cast<fi_context2*>(entries[i].op_context) - ctx.data()));
        inflight -= static_cast<std::size_t>(n);
        last = Clock::now();
      } else if (n == -FI_EAVAIL) {
        throw fail_cq();
      } else if (n != -FI_EAGAIN) {
        throw StorageError(
            fmt::format("{}: fi_cq_read: {}", im.remote.uri, fabric::error_text(n)));
      } else if (Clock::now() - last > timeout) {
        throw StorageError(fmt::format("{}: no reference read completed for {:.1f} s",
                                       im.remote.uri,
                                       im.opt.timeout_s));
      }
    }
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // The connection itself (ofi_rxm connects at the first read) is not part of the figure.
  const FabricRead warm{0, std::min<std::uint64_t>(4096, rbytes)};
  try {
    run({&warm, 1});
    dpos = 0;
    r.seconds = run(reads);
  } catch (...) {
    region = fabric::Region();  // reads in flight land nowhere once the endpoint is closed,
    kept_.reset();              // which must happen while `local` and `ctx` are alive
    throw;
  }
  for (const auto& x : reads) r.bytes += x.len;
  r.reads = reads.size();
  r.window = window;
  r.remote_bytes = rbytes;
  r.local_bytes = local.size();
  r.provider = s->ep->provider();
  return r;
}

}  // namespace solar::storage

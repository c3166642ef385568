// SPDX-License-Identifier: Apache-2.0
// One authenticated client of solar-stored: its hello reply and grant, then its requests on
// a thread of its own, the staging slots it borrows and the reference buffer it may share.
#include "server_impl.h"
#include "solar/storage/fabric_reference.h"  // kMaxReferenceBytes

namespace solar::storage {

StagingSlot* StorageServer::Impl::acquire_slot(const void* who) {
  StagingSlot* got = nullptr;
  {
    std::lock_guard g(slots_mu);
    for (auto& s : slots)  // the one this connection had last: its key is this client's already
      if (!s.busy && s.owner == who) got = &s;
    for (auto& s : slots)
      if (!got && !s.busy) got = &s;
    if (!got) return nullptr;
    got->busy = true;
  }
  if (got->owner != who) {
    // New key: the client that had the slot can no longer read what this one stages there.
    try {
      got->region = fabric::Region();
      got->region = ep->register_memory(got->buf.get(), staging_bytes, FI_REMOTE_READ);
      got->owner = who;
    } catch (const StorageError& e) {
      spdlog::error("staging buffer taken out of use: {}", e.what());
      return nullptr;  // stays busy: never handed out again with a key someone else had
    }
  }
  return got;
}

std::shared_ptr<ReferenceBuffer> StorageServer::Impl::reference_buffer(std::uint64_t bytes) {
  std::lock_guard g(reference_mu);
  auto buf = reference.lock();
  if (!buf || buf->len < bytes) {
    reference = buf = std::make_shared<ReferenceBuffer>(bytes);
    // A client measuring the raw fabric (solar bench io): this much of the node's memory is
    // held until the last client reading it goes.
    spdlog::info("lent a {}-byte reference buffer (plain memory for a raw-fabric measure)",
                 bytes);
  }
  return buf;
}

void StorageServer::Impl::release_slot(StagingSlot* s) {
  if (!s) return;
  std::lock_guard g(slots_mu);
  s->busy = false;
}

json StorageServer::Impl::hello_reply(const json& msg, Exported*& ex) {
  auto fail = [](const std::string& text) { return json{{"ok", false}, {"error", text}}; };
  const wire::Hello hello = wire::parse_hello(msg);
  if (hello.op != "hello") return fail("protocol error: the first message must be hello");
  if (hello.version != wire::kVersion)
    return fail(fmt::format("protocol version {} is not supported (server speaks {}); use the "
                            "same solar release on both sides",
                            hello.version, wire::kVersion));
  if (!opt.token.empty()) {
    const std::string& t = hello.token;
    unsigned char diff = t.size() != opt.token.size();
    for (std::size_t i = 0; i < t.size() && i < opt.token.size(); ++i)
      diff |= static_cast<unsigned char>(t[i] ^ opt.token[i]);
    if (diff)
      return fail("token rejected: this server requires a token; set SOLAR_STORED_TOKEN to the "
                  "one solar-stored was started with");
  }
  const std::string& name = hello.dataset;
  ex = nullptr;
  std::string names;
  for (auto& x : exports) {
    if (x->spec.name == name) ex = x.get();
    names += (names.empty() ? "" : ", ") + x->spec.name;
  }
  for (const auto& [n, why] : unavailable)
    if (!ex && n == name)
      return fail(fmt::format("dataset '{}' is unavailable on this server: {}", name, why));
  if (!ex) return fail(fmt::format("no dataset named '{}' is exported here (exports: {})", name, names));
  if (ex->changed.load(std::memory_order_acquire))
    return fail(fmt::format("dataset '{}' is withdrawn: {}", name, ex->changed_why));
  const DatasetInfo& info = ex->source->info();
  json r = {{"ok", true},
            {"provider", ep->provider()},
            {"address", wire::to_hex(ep->address())},
            {"virt_addr", ep->virt_addr()},
            {"info", wire::to_json(info)},
            {"identity", ex->identity},
            {"throttle", {{"bandwidth", opt.throttle_bandwidth}, {"latency_s", opt.throttle_latency_s}}}};
  return r;
}

Grant StorageServer::Impl::grant(const Exported& ex, json& r) {
  Grant g;
  const DatasetInfo& info = ex.source->info();
  if (ex.rma) {
    g.data = ep->register_memory(ex.data, info.samples * info.sample_bytes, FI_REMOTE_READ);
    r["data"] = {{"mode", "rma"}, {"key", g.data.key()}, {"base", g.data.base()},
                 {"memory", ex.in_memory ? "memory" : "file"}};
  } else {
    r["data"] = {{"mode", "staged"}, {"bytes", staging_bytes}};
  }
  if (!ex.labels.empty()) {
    g.labels = ep->register_memory(ex.labels.data(), ex.labels.size(), FI_REMOTE_READ);
    r["labels"] = {{"key", g.labels.key()}, {"base", g.labels.base()}};
  }
  return g;
}

// After the hello: the requests of one authenticated client, on its own thread.
void StorageServer::Impl::serve(Connection& c, const std::string& peer, Exported* ex) {
  tcp::socket& s = *c.socket;
  StagingSlot* slot = nullptr;
  // The reference buffer this connection reads, if it asked: registered for it alone (its key
  // dies with the connection), closed before the buffer can go.
  std::shared_ptr<ReferenceBuffer> ref;
  fabric::Region ref_region;
  try {
    for (;;) {
      const json msg = wire::receive(s);
      release_slot(std::exchange(slot, nullptr));  // its runs were fetched before this message
      wire::Request req;
      try {
        req = wire::parse_request(msg);
      } catch (const StorageError& e) {
        wire::send(s, {{"ok", false}, {"error", e.what()}});
        continue;
      }
      const std::string& op = req.op;
      if (op == "bye") return;
      if (op == "done") continue;  // staged runs fetched: the slot was released above
      if (op == "reference") {
        try {
          const std::uint64_t bytes =
              std::clamp<std::uint64_t>(req.bytes, 1ULL << 20, kMaxReferenceBytes);
          ref_region = fabric::Region();
          ref = reference_buffer(bytes);
          ref_region = ep->register_memory(ref->p, bytes, FI_REMOTE_READ);
          wire::send(s, {{"ok", true}, {"key", ref_region.key()}, {"base", ref_region.base()},
                         {"bytes", bytes}});
        } catch (const StorageError& e) {
          wire::send(s, {{"ok", false}, {"error", e.what()}});
        }
      } else if (op == "drop_cache") {
        ex->drop_cache();
        wire::send(s, {{"ok", true}});
      } else if (op == "stage") {
        try {
          const std::uint64_t bytes = wire::staged_bytes(ex->source->info(), req.runs,
                                                         staging_bytes,
                                                         "fabric export " + ex->spec.name);
          if (ex->rma)
            throw StorageError(fmt::format("stage request of {} bytes refused (contiguous "
                                           "exports are read directly)",
                                           bytes));
          if (!slot) slot = acquire_slot(&c);
          if (!slot) {
            wire::send(s, {{"ok", false}, {"retry", true},
                           {"error", "server busy: every staging buffer is in use"}});
            continue;
          }
          ex->source->read(req.runs, slot->buf.get());
          wire::send(s, {{"ok", true}, {"bytes", bytes}, {"key", slot->region.key()},
                         {"base", slot->region.base()}});
        } catch (const StorageError& e) {
          wire::send(s, {{"ok", false}, {"error", e.what()}});
        }
      } else {
        wire::send(s, {{"ok", false}, {"error", fmt::format("unknown request '{}'", op)}});
      }
    }
  } catch (const boost::system::system_error&) {
    // the client went away
  } catch (const std::exception& e) {
    spdlog::warn("{}: {}", peer, e.what());
  }
  release_slot(slot);
}

}  // namespace solar::storage

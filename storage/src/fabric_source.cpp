// SPDX-License-Identifier: Apache-2.0
#include "solar/storage/fabric_source.h"

#include "fabric_source_impl.h"

#include <charconv>

namespace solar::storage {

FabricSource::FabricSource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FabricSource::~FabricSource() = default;

std::unique_ptr<FabricSource> FabricSource::connect(const std::string& uri,
                                                    const FabricOptions& options) {
  auto im = std::make_unique<Impl>();
  im->remote.uri = uri;
  im->opt = options;
  const std::string_view rest = std::string_view(uri).substr(std::string_view("fabric://").size());
  const auto slash = rest.find('/');
  const auto colon = rest.substr(0, slash).rfind(':');
  if (!uri.starts_with("fabric://") || slash == std::string_view::npos ||
      colon == std::string_view::npos || slash + 1 == rest.size())
    throw StorageError(fmt::format("source '{}': expected fabric://HOST:PORT/NAME", uri));
  im->remote.host = std::string(rest.substr(0, colon));
  im->remote.port = std::string(rest.substr(colon + 1, slash - colon - 1));
  im->remote.name = std::string(rest.substr(slash + 1));
  unsigned p = 0;
  const std::string& port = im->remote.port;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc() || ptr != port.data() + port.size() || p == 0 || p > 65535)
    throw StorageError(fmt::format("source '{}': port '{}' is not a number in 1..65535", uri,
                                   im->remote.port));
  if (options.timeout_s <= 0) throw StorageError("fabric timeout must be positive");
  im->outage.reconnect_s = options.reconnect_s;
  if (im->outage.reconnect_s < 0) {
    im->outage.reconnect_s = 30;
    if (const char* env = std::getenv("SOLAR_STORED_RECONNECT"); env && *env) {
      char* end = nullptr;
      const double v = std::strtod(env, &end);
      if (end == env || *end || !(v >= 0) || v > 86400)
        throw StorageError(fmt::format("SOLAR_STORED_RECONNECT='{}': expected seconds to keep "
                                       "reconnecting to solar-stored, 0..86400",
                                       env));
      im->outage.reconnect_s = v;
    }
  }
  // A server that is not there is an error at once (a wrong address should not wait), unless
  // the caller knows it was there (wait_for_server); one that answers busy is tried again
  // within the reconnection window.
  for (;;) {
    try {
      im->session = im->open_session(true);
      if (!im->warm_up(*im->session)) im->session.reset();
      break;
    } catch (const TransientError& e) {
      im->next_attempt(e, true);
    }
  }
  im->outage.since.reset();
  return std::unique_ptr<FabricSource>(new FabricSource(std::move(im)));
}

const DatasetInfo& FabricSource::info() const { return impl_->exported.info; }
std::string FabricSource::describe() const { return impl_->remote.uri; }
const std::string& FabricSource::identity() const { return impl_->exported.identity; }
std::string FabricSource::provider() const { return impl_->exported.provider; }
const std::string& FabricSource::served_from() const { return impl_->exported.served_from; }
std::uint64_t FabricSource::bytes_read() const { return impl_->counts.bytes.load(); }
std::uint64_t FabricSource::reconnects() const { return impl_->counts.reconnects.load(); }
std::uint64_t FabricSource::peak_in_flight() const { return impl_->counts.peak_in_flight.load(); }

namespace {
// What a failed read was reading, for its error: the file's samples and where they start.
[[noreturn]] void rethrow_with_offset(const StorageError& e, std::span<const SampleRun> runs,
                                      std::uint64_t unit, const char* what) {
  if (runs.empty()) throw e;
  throw StorageError(fmt::format("{} (reading {} {} from sample {}, byte offset {} of the "
                                 "exported {})",
                                 e.what(), total_samples(runs), what, runs.front().first,
                                 runs.front().first * unit, what));
}
}  // namespace

// Function try blocks: a read that fails for good says where in the dataset it was.
void FabricSource::read(std::span<const SampleRun> runs, std::byte* dst) try {
  Impl& im = *impl_;
  check_runs(im.exported.info, runs, im.remote.uri);
  const std::uint64_t sb = im.exported.info.sample_bytes;
  const std::uint64_t total = total_samples(runs) * sb;
  if (total == 0) return;
  const std::uint64_t max_piece = std::max<std::uint64_t>(1, im.opt.request_bytes);

  if (im.exported.rma) {
    // Contiguous exports: pieces address the remote file directly, read together with other
    // threads' (submit); what is done survives reconnections.
    Request req;
    req.dst = dst;
    req.bytes = total;
    std::byte* out = dst;
    for (const auto& r : runs) {
      std::uint64_t off = r.first * sb, left = r.count * sb;
      while (left) {
        const std::uint64_t n = std::min(left, max_piece);
        req.pieces.push_back({0, off, n, out});
        off += n;
        out += n;
        left -= n;
      }
    }
    im.submit(req);
    return;
  }

  // Staged exports: batches of runs that fit the staging buffer, done batch by batch, on the
  // session alone (its stage requests and replies share the bootstrap socket).
  std::size_t staged_run = 0;
  std::uint64_t staged_skip = 0;  // samples of runs[staged_run] already delivered
  std::byte* staged_out = dst;
  im.exclusive([&] {
    im.with_retries([&](Session& s) {
      if (s.rma)
        throw StorageError(fmt::format("{}: the server now exports the file for RMA reads; "
                                       "reconnect",
                                       im.remote.uri));
      const std::uint64_t per_batch = std::max<std::uint64_t>(1, s.staging_bytes / sb);
      while (staged_run < runs.size()) {
        std::vector<SampleRun> batch;
        std::uint64_t n = 0;
        std::size_t r = staged_run;
        std::uint64_t skip = staged_skip;
        while (r < runs.size() && n < per_batch) {
          const std::uint64_t take = std::min(runs[r].count - skip, per_batch - n);
          batch.push_back({runs[r].first + skip, take});
          n += take;
          skip += take;
          if (skip == runs[r].count) {
            ++r;
            skip = 0;
          }
        }
        json req = {{"op", "stage"}, {"runs", json::array()}};
        for (const auto& b : batch) req["runs"].push_back({b.first, b.count});
        const json reply = im.request(s, req);
        if (!reply.value("ok", false)) {
          const std::string err = reply.value("error", std::string("no reason given"));
          if (reply.value("retry", false)) throw TransientError(im.remote.uri + ": " + err);
          throw StorageError(fmt::format("{}: the server refused a read: {}", im.remote.uri, err));
        }
        const std::string bad = im.remote.uri + ": the server's stage reply is bad";
        const std::uint64_t key = wire::count_field(reply.at("key"), bad);
        const std::uint64_t base = wire::count_field(reply.at("base"), bad);
        std::vector<Piece> bp;
        for (std::uint64_t off = 0; off < n * sb; off += max_piece)
          bp.push_back({key, base + off, std::min(max_piece, n * sb - off), staged_out + off});
        std::vector<char> bdone(bp.size(), 0);
        im.run_pieces(s, bp, bdone, staged_out, n * sb);
        staged_out += n * sb;
        staged_run = r;
        staged_skip = skip;
      }
      // The staged runs are here: the server may hand the staging buffer to another client.
      try {
        wire::send(s.sock, {{"op", "done"}});
      } catch (const boost::system::system_error& e) {
        throw TransientError(fmt::format("{}: lost the connection to the server ({})",
                                         im.remote.uri,
                                         e.code().message()));
      }
    });
  });
} catch (const StorageError& e) {
  rethrow_with_offset(e, runs, impl_->exported.info.sample_bytes, "samples");
}

void FabricSource::read_labels(std::span<const SampleRun> runs, std::byte* dst) try {
  Impl& im = *impl_;
  if (!im.exported.info.has_labels)
    throw StorageError(fmt::format("{}: the exported dataset has no labels", im.remote.uri));
  check_runs(im.exported.info, runs, im.remote.uri);
  const std::uint64_t lb = im.exported.info.label_bytes;
  Request req;
  req.labels = true;
  req.dst = dst;
  std::byte* out = dst;
  for (const auto& r : runs) {
    req.pieces.push_back({0, r.first * lb, r.count * lb, out});
    out += r.count * lb;
  }
  req.bytes = static_cast<std::uint64_t>(out - dst);
  if (req.bytes == 0) return;
  if (im.exported.rma) {
    im.submit(req);
    return;
  }
  // A staged export: its session's completion queue is polled by staged reads (run_pieces),
  // so labels are read there too, on the session alone.
  std::vector<char> done(req.pieces.size(), 0);
  im.exclusive([&] {
    im.with_retries([&](Session& s) {
      std::vector<Piece> pieces = req.pieces;
      for (auto& p : pieces) {
        p.key = s.labels.key;
        p.addr += s.labels.base;
      }
      im.run_pieces(s, pieces, done, dst, req.bytes);
    });
  });
} catch (const StorageError& e) {
  rethrow_with_offset(e, runs, impl_->exported.info.label_bytes, "labels");
}

void FabricSource::drop_cache() {
  impl_->exclusive([&] {
    impl_->with_retries([&](Session& s) { impl_->request(s, {{"op", "drop_cache"}}); });
  });
}

}  // namespace solar::storage

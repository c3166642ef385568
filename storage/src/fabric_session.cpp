// SPDX-License-Identifier: Apache-2.0
// One connection to solar-stored (the bootstrap hello, the fabric endpoint), its requests,
// and the reconnection window when it is lost.
#include "fabric_source_impl.h"

namespace solar::storage {

std::unique_ptr<Session> FabricSource::Impl::open_session(bool first, bool wait) {
  auto s = std::make_unique<Session>();
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(opt.timeout_s * 1000));
  try {
    tcp::resolver resolver(s->io);
    const auto endpoints = resolver.resolve(remote.host, remote.port);
    // Within timeout_s: an unreachable host must not hold the caller for the kernel's minutes.
    boost::system::error_code ec = asio::error::would_block;
    asio::async_connect(s->sock, endpoints,
                        [&ec](const boost::system::error_code& e, const tcp::endpoint&) { ec = e; });
    s->io.run_for(timeout);
    if (ec == asio::error::would_block) {
      s->sock.close();
      s->io.restart();
      s->io.run();  // the aborted connect's handler
      ec = asio::error::timed_out;
    }
    if (ec) throw boost::system::system_error(ec);
    s->sock.native_non_blocking(false);  // wire:: does blocking I/O with SO_RCVTIMEO
  } catch (const boost::system::system_error& e) {
    const std::string msg = fmt::format("{}: cannot connect to {}:{}: {}; is solar-stored running "
                                        "there?",
                                        remote.uri, remote.host, remote.port, e.code().message());
    // The first connection fails at once, unless the server is known to exist and may be
    // restarting (wait_for_server): then it is retried within the window, as a lost one is.
    if (first && !opt.wait_for_server) throw StorageError(msg);
    throw TransientError(msg);
  }
  const int ms = static_cast<int>(opt.timeout_s * 1000);
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  ::setsockopt(s->sock.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(s->sock.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  std::string token = opt.token;
  if (token.empty())
    if (const char* t = std::getenv("SOLAR_STORED_TOKEN")) token = t;
  const json reply = request(*s, {{"op", "hello"}, {"version", wire::kVersion}, {"token", token},
                                  {"dataset", remote.name}});
  if (!reply.value("ok", false)) {
    const std::string msg = fmt::format("{}: the server refused: {}", remote.uri,
                                        reply.value("error", std::string("no reason given")));
    if (reply.value("retry", false)) throw TransientError(msg);  // busy: worth another try
    throw StorageError(msg);
  }
  try {
    const std::string bad_hello = remote.uri + ": the server's hello reply is bad";
    const DatasetInfo i = wire::info_from_json(reply.at("info"));
    const std::string id = reply.at("identity").get<std::string>();
    if (first) {
      exported.info = i;
      exported.identity = id;
      exported.provider =
          opt.provider.empty() ? reply.at("provider").get<std::string>() : opt.provider;
      link.bandwidth = wire::rate_field(reply.at("throttle").at("bandwidth"), bad_hello);
      link.latency = wire::rate_field(reply.at("throttle").at("latency_s"), bad_hello);
    } else if (id != exported.identity) {
      throw StorageError(fmt::format("{}: the server came back exporting a different file; "
                                     "refusing to mix its bytes into this read",
                                     remote.uri));
    }
    const json& d = reply.at("data");
    s->rma = d.at("mode") == "rma";
    if (first) {
      exported.rma = s->rma;
      exported.served_from = !s->rma ? "staged" : d.value("memory", std::string("file"));
    }
    if (s->rma)
      s->data = {wire::count_field(d.at("key"), bad_hello),
                 wire::count_field(d.at("base"), bad_hello)};
    else
      s->staging_bytes = wire::count_field(d.at("bytes"), bad_hello);
    if (reply.contains("labels"))
      s->labels = {wire::count_field(reply["labels"].at("key"), bad_hello),
                   wire::count_field(reply["labels"].at("base"), bad_hello)};
    s->ep = fabric::Endpoint::open(exported.provider, "", wait);
    if (s->ep->virt_addr() != reply.at("virt_addr").get<bool>())
      throw StorageError(fmt::format("{}: provider {} disagrees with the server's about "
                                     "FI_MR_VIRT_ADDR; use the server's provider",
                                     remote.uri, exported.provider));
    s->server = s->ep->insert(wire::from_hex(reply.at("address").get<std::string>()));
  } catch (const json::exception& e) {
    throw StorageError(
        fmt::format("{}: protocol error in the server's reply ({})", remote.uri, e.what()));
  }
  return s;
}

json FabricSource::Impl::request(Session& s, const json& msg) {
  try {
    wire::send(s.sock, msg);
    return wire::receive(s.sock);
  } catch (const boost::system::system_error& e) {
    throw TransientError(fmt::format("{}: lost the connection to the server ({})", remote.uri,
                                     e.code().message()));
  }
}

void FabricSource::Impl::next_attempt(const StorageError& e, bool first) {
  const auto now = Clock::now();
  if (!outage.since) {
    outage.since = now;
    outage.attempts = 0;
    if (outage.reconnect_s > 0)
      spdlog::warn("{}; reconnecting for up to {:g} s (SOLAR_STORED_RECONNECT)", e.what(),
                   outage.reconnect_s);
  }
  ++outage.attempts;
  const double waited = std::chrono::duration<double>(now - *outage.since).count();
  if (waited >= outage.reconnect_s)
    throw StorageError(fmt::format(
        "{} (gave up after {} attempt{} in {:.1f} s: solar-stored at {}:{} did not {} within "
        "{:g} s; SOLAR_STORED_RECONNECT=SECONDS waits longer)",
        e.what(), outage.attempts, outage.attempts == 1 ? "" : "s", waited, remote.host,
        remote.port, first ? "accept the connection" : "come back", outage.reconnect_s));
  const double backoff = 0.1 * static_cast<double>(1u << std::min(outage.attempts - 1, 5u));
  std::this_thread::sleep_for(
      std::chrono::duration<double>(std::min({2.0, backoff, outage.reconnect_s - waited})));
}

void FabricSource::Impl::drop_session() {
  // Registrations first: their domain goes with the endpoint.
  for (Request* r : active) r->local = fabric::Region();
  session.reset();
  // Reads that were in flight land nowhere now: issue them again on the next session.
  driver.reset();
  for (Request* r : active) r->next = 0;
  ops_gen = session_gen;
}

}  // namespace solar::storage

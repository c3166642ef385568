// One connection to solar-stored (the bootstrap hello, the fabric endpoint), its requests,
// and the reconnection window when it is lost.
#include "fabric_source_impl.h"

namespace solar::storage {

std::unique_ptr<Session> FabricSource::Impl::open_session(bool first, bool wait) {
  auto s = std::make_unique<Session>();
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(opt.timeout_s * 1000));
  try {
    tcp::resolver resolver(s->io);
    const auto endpoints = resolver.resolve(host, port);
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
                                        uri, host, port, e.code().message());
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
                                  {"dataset", name}});
  if (!reply.value("ok", false)) {
    const std::string msg = fmt::format("{}: the server refused: {}", uri,
                                        reply.value("error", std::string("no reason given")));
    if (reply.value("retry", false)) throw TransientError(msg);  // busy: worth another try
    throw StorageError(msg);
  }
  try {
    const std::string bad_hello = uri + ": the server's hello reply is bad";
    const DatasetInfo i = wire::info_from_json(reply.at("info"));
    const std::string id = reply.at("identity").get<std::string>();
    if (first) {
      info = i;
      identity = id;
      provider = opt.provider.empty() ? reply.at("provider").get<std::string>() : opt.provider;
      bandwidth = wire::rate_field(reply.at("throttle").at("bandwidth"), bad_hello);
      latency = wire::rate_field(reply.at("throttle").at("latency_s"), bad_hello);
    } else if (id != identity) {
      throw StorageError(fmt::format("{}: the server came back exporting a different file; "
                                     "refusing to mix its bytes into this read",
                                     uri));
    }
    const json& d = reply.at("data");
    s->rma = d.at("mode") == "rma";
    if (first) {
      rma = s->rma;
      served_from = !s->rma ? "staged" : d.value("memory", std::string("file"));
    }
    if (s->rma)
      s->data = {wire::count_field(d.at("key"), bad_hello),
                 wire::count_field(d.at("base"), bad_hello)};
    else
      s->staging_bytes = wire::count_field(d.at("bytes"), bad_hello);
    if (reply.contains("labels"))
      s->labels = {wire::count_field(reply["labels"].at("key"), bad_hello),
                   wire::count_field(reply["labels"].at("base"), bad_hello)};
    s->ep = fabric::Endpoint::open(provider, "", wait);
    if (s->ep->virt_addr() != reply.at("virt_addr").get<bool>())
      throw StorageError(fmt::format("{}: provider {} disagrees with the server's about "
                                     "FI_MR_VIRT_ADDR; use the server's provider",
                                     uri, provider));
    s->server = s->ep->insert(wire::from_hex(reply.at("address").get<std::string>()));
  } catch (const json::exception& e) {
    throw StorageError(fmt::format("{}: protocol error in the server's reply ({})", uri, e.what()));
  }
  return s;
}

json FabricSource::Impl::request(Session& s, const json& msg) {
  try {
    wire::send(s.sock, msg);
    return wire::receive(s.sock);
  } catch (const boost::system::system_error& e) {
    throw TransientError(fmt::format("{}: lost the connection to the server ({})", uri,
                                     e.code().message()));
  }
}

void FabricSource::Impl::next_attempt(const StorageError& e, bool first) {
  const auto now = Clock::now();
  if (!outage_since) {
    outage_since = now;
    outage_attempts = 0;
    if (reconnect_s > 0)
      spdlog::warn("{}; reconnecting for up to {:g} s (SOLAR_STORED_RECONNECT)", e.what(),
                   reconnect_s);
  }
  ++outage_attempts;
  const double waited = std::chrono::duration<double>(now - *outage_since).count();
  if (waited >= reconnect_s)
    throw StorageError(fmt::format(
        "{} (gave up after {} attempt{} in {:.1f} s: solar-stored at {}:{} did not {} within "
        "{:g} s; SOLAR_STORED_RECONNECT=SECONDS waits longer)",
        e.what(), outage_attempts, outage_attempts == 1 ? "" : "s", waited, host, port,
        first ? "accept the connection" : "come back", reconnect_s));
  const double backoff = 0.1 * static_cast<double>(1u << std::min(outage_attempts - 1, 5u));
  std::this_thread::sleep_for(
      std::chrono::duration<double>(std::min({2.0, backoff, reconnect_s - waited})));
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

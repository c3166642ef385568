// SPDX-License-Identifier: Apache-2.0
#include "solar/storage/server.h"

#include "server_impl.h"
#include "solar/sys/atomic_file.h"

namespace solar::storage {

// Under TSan (scripts/sanitize thread): the provider's progress, driven by the thread below,
// sends staging buffers' bytes to clients' RMA reads; a buffer is reused only after its client
// has the bytes and has sent its next message, an ordering that runs through the other process
// and that TSan cannot see. Its memory accesses inside fi_cq_read are libfabric's, and are not
// recorded (synchronisation still is): scripts/sanitizers/tsan.supp could not match them by
// name once TSan had lost the stack ("failed to restore the stack").
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
inline void tsan_ignore_begin() { __tsan_ignore_thread_begin(); }
inline void tsan_ignore_end() { __tsan_ignore_thread_end(); }
#else
inline void tsan_ignore_begin() {}
inline void tsan_ignore_end() {}
#endif

StorageServer::StorageServer(ServerOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& im = *impl_;
  im.opt = std::move(options);
  if (im.opt.exports.empty())
    throw StorageError("--export: give at least one NAME=FILE.h5:/dataset");
  if (im.opt.max_pending == 0 || im.opt.max_clients == 0 || !(im.opt.hello_timeout_s > 0))
    throw StorageError("--max-pending, --max-clients and --hello-timeout must be > 0");
  // Every connection is a descriptor: take the hard limit, as servers do (1024 is the usual
  // soft one), so the caps above are what bounds the server.
  if (rlimit nofile{}; ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &nofile);
  }
  std::string provider = im.opt.provider;
  if (provider.empty() && !std::getenv("FI_PROVIDER")) provider = "tcp;ofi_rxm";
  im.ep = fabric::Endpoint::open(provider, im.opt.host == "0.0.0.0" ? "" : im.opt.host,
                                 !im.opt.busy_poll);
  spdlog::info("fabric progress: {}", im.ep->waitable() ? "sleeping on the completion queue's "
                                                          "wait object until a read arrives"
                                                        : "polling (without pause while a client is "
                                                          "connected, every 5 ms while none is)");
  // A bad export (missing, truncated, wrong rank) is reported and refused to clients that ask
  // for it; the others are served. With none usable the server does not start.
  std::string errors;
  for (const auto& e : im.opt.exports) {
    try {
      im.open_export(e);
    } catch (const StorageError& err) {
      spdlog::error("{}", err.what());
      im.unavailable.emplace_back(e.name, err.what());
      errors += fmt::format("\n  {}", err.what());
    }
  }
  if (im.exports.empty()) throw StorageError("no export could be opened:" + errors);
  if (im.staging_bytes) {
    im.staging_bytes = std::max(im.staging_bytes, im.opt.staging_bytes);
    im.slots.resize(4);
    for (auto& s : im.slots) {
      s.buf = std::make_unique_for_overwrite<std::byte[]>(im.staging_bytes);
      s.region = im.ep->register_memory(s.buf.get(), im.staging_bytes, FI_REMOTE_READ);
    }
  }
  im.progress = std::thread([&im] {
    // Target-side progress: reads do not complete unless someone drives the provider.
    fi_cq_entry entries[16];
    bool waiting = im.ep->waitable();
    auto next_watch = std::chrono::steady_clock::now();
    // Without a wait object (shm) the provider is polled without pause, but only while a
    // client is connected: idle, the server polls every few milliseconds instead of spinning
    // a core of the node it shares with the job (it did, 100% of one, with no client at all).
    // A client says hello over TCP before its first fi_read, and is counted before the reply.
    bool clients = true;
    auto next_clients = next_watch;
    while (!im.stopping.load(std::memory_order_relaxed)) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= next_watch) {
        im.watch_exports();
        next_watch = now + std::chrono::milliseconds(500);
      }
      if (!waiting && now >= next_clients) {
        clients = im.any_client();
        next_clients = now + std::chrono::milliseconds(5);
      }
      // Woken by the provider's sockets; at the latest after 10 ms, for watch_exports, stop
      // and any progress a provider does not signal (connection set-up).
      tsan_ignore_begin();
      const ssize_t n = waiting ? fi_cq_sread(im.ep->cq(), entries, 16, nullptr, 10)
                                : fi_cq_read(im.ep->cq(), entries, 16);
      fi_cq_err_entry err{};
      if (n == -FI_EAVAIL) fi_cq_readerr(im.ep->cq(), &err, 0);
      tsan_ignore_end();
      if (n == -FI_EAGAIN || n == -FI_ETIMEDOUT) {
        if (!waiting && clients)
          sched_yield();
        else if (!waiting)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
      } else if (n == -FI_EAVAIL) {
        spdlog::warn("completion error: {}", fabric::error_text(err.err));
      } else if (n < 0 && waiting) {
        spdlog::warn("fi_cq_sread: {}; busy polling from now on", fabric::error_text(n));
        waiting = false;
      }
    }
  });
}

StorageServer::~StorageServer() {
  stop();
  impl_->reap(true);
  impl_->stopping = true;
  if (impl_->progress.joinable()) impl_->progress.join();
}

std::uint16_t StorageServer::port() const { return impl_->port; }

void StorageServer::stop() {
  asio::post(impl_->io, [im = impl_.get()] {
    boost::system::error_code ec;
    im->acceptor.close(ec);
    im->io.stop();
  });
}

// Connections' threads never close their sockets (only shut them down): the descriptors read
// here stay theirs until the erase below closes them.
void StorageServer::Impl::reap(bool all) {
  std::lock_guard g(conns_mu);
  for (auto it = conns.begin(); it != conns.end();) {
    if (all && !it->finished) ::shutdown(it->socket->native_handle(), SHUT_RDWR);
    if (all || it->finished) {
      if (it->thread.joinable()) it->thread.join();
      it = conns.erase(it);
    } else {
      ++it;
    }
  }
}

// A refusal the peer may read (best effort, never blocking the io thread), then the close.
void StorageServer::Impl::refuse_busy(tcp::socket& s, const std::string& why) {
  const std::string f = wire::frame({{"ok", false}, {"retry", true}, {"error", why}});
  [[maybe_unused]] const ssize_t n =
      ::send(s.native_handle(), f.data(), f.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  boost::system::error_code ignored;
  s.close(ignored);
}

void StorageServer::Impl::log_refusal(const std::string& peer, const std::string& why) {
  const auto now = std::chrono::steady_clock::now();
  if (now - refusals.since >= std::chrono::seconds(1)) {
    if (refusals.hidden)
      spdlog::warn("{} more connection{} refused or closed before authenticating (not shown)",
                   refusals.hidden, refusals.hidden == 1 ? "" : "s");
    refusals = {now, 0, 0};
  }
  if (refusals.shown < 5) {
    ++refusals.shown;
    spdlog::warn("{}: {}", peer, why);
  } else {
    ++refusals.hidden;
  }
}

void StorageServer::Impl::accept() {
  acceptor.async_accept([this](boost::system::error_code ec, tcp::socket s) {
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      // Out of descriptors (or another transient failure): wait a little rather than spin,
      // and say so every 10 s at most.
      static std::chrono::steady_clock::time_point said{};
      if (const auto now = std::chrono::steady_clock::now(); now - said >= std::chrono::seconds(10)) {
        spdlog::warn("accept: {} (new connections wait)", ec.message());
        said = now;
      }
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](const boost::system::error_code& e) {
        if (!e && acceptor.is_open()) accept();
      });
      return;
    }
    reap(false);
    boost::system::error_code pe;
    const auto ep_ = s.remote_endpoint(pe);
    const std::string peer = pe ? "client" : fmt::format("{}:{}", ep_.address().to_string(), ep_.port());
    auto sock = std::make_shared<tcp::socket>(std::move(s));
    if (greeting >= opt.max_pending) {
      const std::string why = fmt::format("server busy: {} connections are waiting to "
                                          "authenticate (--max-pending); try again",
                                          greeting);
      refuse_busy(*sock, why);
      log_refusal(peer, "refused: " + why);
    } else
      greet(std::make_shared<Greeting>(*this, std::move(sock), peer));
    accept();
  });
}

void StorageServer::Impl::greet(const std::shared_ptr<Greeting>& g) {
  g->timer.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(opt.hello_timeout_s)));
  g->timer.async_wait([g](const boost::system::error_code& e) {
    if (e) return;  // cancelled: the hello came
    g->timed_out = true;
    boost::system::error_code ignored;
    g->sock->close(ignored);  // the pending read ends with operation_aborted
  });
  asio::async_read(*g->sock, asio::buffer(g->len, 4), [this, g](boost::system::error_code ec,
                                                                std::size_t) {
    if (ec) {
      if (g->timed_out)
        log_refusal(g->peer, fmt::format("no hello within {:g} s; closed", opt.hello_timeout_s));
      return;
    }
    const std::uint32_t n = wire::frame_length(g->len);
    if (n > wire::kMaxHello) {
      // Refused before anything of that size is allocated.
      g->timer.cancel();
      const std::string why = fmt::format("protocol error: a {}-byte first message (a hello is "
                                          "at most {} bytes); is the peer a solar client?",
                                          n, wire::kMaxHello);
      log_refusal(g->peer, "refused: " + why);
      const std::string f = wire::frame({{"ok", false}, {"error", why}});
      [[maybe_unused]] const ssize_t w =
          ::send(g->sock->native_handle(), f.data(), f.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      boost::system::error_code ignored;
      g->sock->close(ignored);
      return;
    }
    g->body.resize(n);
    asio::async_read(*g->sock, asio::buffer(g->body), [this, g](boost::system::error_code ec2,
                                                                std::size_t) {
      if (ec2) {
        if (g->timed_out)
          log_refusal(g->peer, fmt::format("no hello within {:g} s; closed", opt.hello_timeout_s));
        return;
      }
      g->timer.cancel();
      welcome(*g);
    });
  });
}

// The hello is here (io thread): check it, register the client's memory, reply, and hand an
// accepted connection to a thread of its own.
void StorageServer::Impl::welcome(Greeting& g) {
  boost::system::error_code ignored;
  tcp::socket& s = *g.sock;
  // Blocking from here on (the session thread uses wire:: on the descriptor); a reply that
  // cannot be written within a second is not waited for.
  s.native_non_blocking(false, ignored);
  timeval tv{1, 0};
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  Exported* ex = nullptr;
  json reply;
  try {
    reply = hello_reply(wire::parse_body(g.body), ex);
  } catch (const std::exception& e) {  // not JSON, or fields of the wrong type
    reply = {{"ok", false}, {"error", fmt::format("protocol error in the hello: {}", e.what())}};
  }
  g.body = std::string();
  Grant granted;
  if (reply["ok"].get<bool>()) {
    try {
      granted = grant(*ex, reply);
    } catch (const StorageError& e) {
      reply = {{"ok", false}, {"error", fmt::format("server cannot register memory: {}", e.what())}};
    }
  }
  Connection* c = nullptr;
  if (reply["ok"].get<bool>()) {
    std::lock_guard lk(conns_mu);
    std::size_t live = 0;
    for (const auto& x : conns) live += !x.finished;
    if (ex->changed.load(std::memory_order_acquire)) {
      // Withdrawn meanwhile: no keys. Checked under conns_mu, which watch_exports holds while
      // it withdraws, so a client refused here finds every earlier reader already hung up on.
      reply = {{"ok", false},
               {"error", "dataset '" + ex->spec.name + "' is withdrawn: " + ex->changed_why}};
    } else if (live >= opt.max_clients) {
      reply = {{"ok", false}, {"retry", true},
               {"error", fmt::format("server busy: {} clients connected (--max-clients); try "
                                     "again", live)}};
    } else {
      c = &conns.emplace_back();
      c->socket = g.sock;
      c->reading = ex;
    }
  }
  const bool ok = reply["ok"].get<bool>();
  try {
    wire::send(s, reply);
  } catch (const boost::system::system_error&) {
    if (c) c->finished = true;  // gone before the reply: nothing to serve
    s.close(ignored);
    return;
  }
  if (!ok) {
    log_refusal(g.peer, "refused: " + reply["error"].get<std::string>());
    if (c) c->finished = true;
    s.close(ignored);
    return;
  }
  tv = {0, 0};
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  spdlog::info("{}: reading {}", g.peer, ex->spec.name);
  try {
    c->thread = std::thread([this, c, ex, peer = g.peer, granted = std::move(granted)]() mutable {
      serve(*c, peer, ex);
      granted = Grant();  // its keys read nothing once the client has gone
      // Shut down, not closed: the client sees the end now, and the descriptor stays valid
      // until reap() joins this thread and drops the socket. A close here would race with
      // reap(true) reading the descriptor to shut it down (and could shut down a reused one).
      ::shutdown(c->socket->native_handle(), SHUT_RDWR);
      c->finished = true;
      // Closed now, on the io thread, not only when the next client connects: a server whose
      // last job has ended holds no descriptor of it (the soak counts them).
      asio::post(io, [this] { reap(false); });
    });
  } catch (const std::system_error& e) {  // no thread to be had: the client will retry
    spdlog::error("{}: cannot start a thread for it: {}", g.peer, e.what());
    s.close(ignored);
    c->finished = true;
  }
}

void StorageServer::run() {
  Impl& im = *impl_;
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(im.opt.host, ec);
  if (ec)
    throw StorageError(fmt::format("--listen {}: not an IP address (use e.g. 127.0.0.1 or 0.0.0.0)",
                                   im.opt.host));
  tcp::endpoint where(addr, im.opt.port);
  im.acceptor.open(where.protocol());
  im.acceptor.set_option(tcp::acceptor::reuse_address(true));
  im.acceptor.bind(where, ec);
  if (ec)
    throw StorageError(fmt::format("--listen {}:{}: {}", im.opt.host, im.opt.port, ec.message()));
  im.acceptor.listen();
  im.port = im.acceptor.local_endpoint().port();
  asio::signal_set signals(im.io, SIGINT, SIGTERM);
  signals.async_wait([this](const boost::system::error_code& e, int sig) {
    if (!e) spdlog::info("signal {}: stopping", sig);
    stop();
  });
  im.accept();
  spdlog::info("listening on {}:{} (provider {}{})", im.opt.host, im.port, im.ep->provider(),
               im.opt.token.empty() ? "" : ", token required");
  if (im.opt.throttle_bandwidth || im.opt.throttle_latency_s)
    spdlog::info("emulating a contended file system: {} B/s per client, +{} s per request",
                 im.opt.throttle_bandwidth, im.opt.throttle_latency_s);
  if (!im.opt.ready_file.empty())
    if (const char* failed = sys::write_file_atomically(
            im.opt.ready_file, fmt::format("{}:{}\n", im.opt.host, im.port), 0666))
      throw StorageError(fmt::format("--ready-file {}: {}: {}", im.opt.ready_file, failed,
                                     std::strerror(errno)));
  if (im.opt.on_ready) im.opt.on_ready(im.opt.host, im.port);
  im.io.run();
  im.reap(true);
}

}  // namespace solar::storage

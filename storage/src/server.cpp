#include "solar/storage/server.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <list>
#include <mutex>
#include <system_error>
#include <spdlog/spdlog.h>
#include <thread>
#include <utility>

#include "fabric.h"
#include "solar/core/config.h"
#include "solar/core/plan_file.h"
#include "solar/storage/hdf5_source.h"
#include "wire.h"

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
namespace asio = boost::asio;
using asio::ip::tcp;
using nlohmann::json;

Export Export::parse(const std::string& spec) {
  const auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    throw StorageError(fmt::format("--export '{}': expected NAME=FILE.h5:/dataset", spec));
  Export e;
  e.name = spec.substr(0, eq);
  for (char c : e.name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
      throw StorageError(fmt::format("--export '{}': the name may use letters, digits, - _ . only",
                                     spec));
  std::string rest = spec.substr(eq + 1);
  e.dataset = "/data";
  if (auto pos = rest.rfind(":/"); pos != std::string::npos && pos > 0) {
    e.dataset = rest.substr(pos + 1);
    rest = rest.substr(0, pos);
  }
  e.path = rest;
  return e;
}

namespace {

// One exported dataset and the memory clients read it from.
struct Exported {
  Export spec;
  std::unique_ptr<Hdf5Source> source;
  std::string identity;  // changes when the file does: clients refuse to resume on another
  bool rma = false;      // contiguous: mapped and registered; else staged
  // With --in-memory: `map` is the server's own (anonymous) copy of the data, not the file's
  // page cache. It has no cache to drop (MADV_DONTNEED would zero it).
  bool in_memory = false;
  void* map = nullptr;
  std::size_t map_len = 0;
  const std::byte* data = nullptr;
  std::vector<std::byte> labels;
  // Set once when the file changed in place under the mapping: no more grants, and the
  // connections reading it are closed (their keys revoked).
  std::atomic<bool> changed{false};
  std::string changed_why;

  ~Exported() {
    if (map) ::munmap(map, map_len);
  }
  // A client's drop_cache: the mapped file's pages and the file's page cache; the server's
  // own copy is no cache, and is left alone.
  void drop_cache() {
    if (in_memory) return;
    if (map) ::madvise(map, map_len, MADV_DONTNEED);
    source->drop_cache();
  }
};

// What one authenticated connection may read: the export's data and labels, registered for it
// alone with fresh random keys after its token was checked, and closed when it leaves. A key
// is never handed to anyone who did not pass the token check, and a departed client's keys no
// longer read anything.
struct Grant {
  fabric::Region data, labels;
};

// A registered buffer a connection stages runs into. Held from a stage request until that
// connection's next message (the client has fetched the runs by then), so any number of
// connections share the few slots; it is re-keyed whenever another connection takes it.
struct StagingSlot {
  std::unique_ptr<std::byte[]> buf;
  fabric::Region region;
  bool busy = false;
  const void* owner = nullptr;  // the connection its current key was handed to
};

// Plain memory for the raw-fabric reference (wire "reference"): no file behind it, so a
// client measuring the fabric measures neither the page cache nor solar's read path. Filled
// once, so its pages are real (untouched anonymous pages all map the one zero page, which
// would be read from cache and flatter the fabric).
struct ReferenceBuffer {
  explicit ReferenceBuffer(std::size_t n) : len(n) {
    p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      p = nullptr;
      throw StorageError(fmt::format("cannot allocate a {}-byte reference buffer: {}", len,
                                     std::strerror(errno)));
    }
    std::memset(p, 0x5a, len);
  }
  ~ReferenceBuffer() {
    if (p) ::munmap(p, len);
  }
  void* p = nullptr;
  std::size_t len = 0;
};

}  // namespace

struct StorageServer::Impl {
  ServerOptions opt;
  std::unique_ptr<fabric::Endpoint> ep;
  std::vector<std::unique_ptr<Exported>> exports;
  std::vector<std::pair<std::string, std::string>> unavailable;  // name, why
  std::uint64_t staging_bytes = 0;
  std::vector<StagingSlot> slots;
  std::mutex slots_mu;
  // The reference buffer: one for all connections (those reading it keep it alive, and it
  // goes with the last of them), replaced by a larger one when a client asks for more (at
  // most kMaxReferenceBytes).
  std::mutex reference_mu;
  std::weak_ptr<ReferenceBuffer> reference;

  std::atomic<bool> stopping{false};
  std::thread progress;
  // Connections that have not said hello yet (io thread only). Declared before `io`: the
  // greetings still pending when the server stops are destroyed with it, and count down here.
  unsigned greeting = 0;
  // Refusals before authentication are logged 5 a second at most (a flood of strangers must
  // not fill the disk); the rest are counted and reported in one line. io thread only.
  struct Refusals {
    std::chrono::steady_clock::time_point since{};
    unsigned shown = 0;
    std::uint64_t hidden = 0;
  } refusals;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  std::uint16_t port = 0;

  // An authenticated connection: one thread, blocking I/O, until it leaves.
  struct Connection {
    std::shared_ptr<tcp::socket> socket;
    std::atomic<Exported*> reading{nullptr};
    std::thread thread;
    std::atomic<bool> finished{false};
  };
  std::mutex conns_mu;
  std::list<Connection> conns;

  // A connection before its hello: read on the io thread (no thread of its own) into a buffer
  // of at most wire::kMaxHello bytes, and closed if no hello comes within hello_timeout_s.
  struct Greeting {
    Greeting(Impl& im, std::shared_ptr<tcp::socket> s, std::string p)
        : impl(im), sock(std::move(s)), peer(std::move(p)), timer(im.io) {
      ++impl.greeting;
    }
    ~Greeting() { --impl.greeting; }
    Impl& impl;
    std::shared_ptr<tcp::socket> sock;
    std::string peer;
    asio::steady_timer timer;
    unsigned char len[4] = {};
    std::string body;
    bool timed_out = false;
  };

  void open_export(const Export& e);
  void load_into_memory(Exported& ex);
  void accept();
  void greet(const std::shared_ptr<Greeting>& g);
  void welcome(Greeting& g);
  void refuse_busy(tcp::socket& s, const std::string& why);
  void log_refusal(const std::string& peer, const std::string& why);
  void serve(Connection& c, const std::string& peer, Exported* ex);
  void watch_exports();
  bool any_client() {  // an authenticated connection still being served
    std::lock_guard g(conns_mu);
    return std::any_of(conns.begin(), conns.end(), [](const Connection& c) { return !c.finished; });
  }
  json hello_reply(const json& hello, Exported*& ex);
  Grant grant(const Exported& ex, json& reply);
  std::shared_ptr<ReferenceBuffer> reference_buffer(std::uint64_t bytes);
  StagingSlot* acquire_slot(const void* who);
  void release_slot(StagingSlot* s);
  void reap(bool all);
};

void StorageServer::Impl::open_export(const Export& e) {
  for (const auto& x : exports)
    if (x->spec.name == e.name)
      throw StorageError(fmt::format("--export {}: the name is used twice", e.name));
  auto ex = std::make_unique<Exported>();
  ex->spec = e;
  Hdf5Options ho;
  ho.io_threads = 2;
  try {
    ex->source = Hdf5Source::open(e.path, e.dataset, ho);
  } catch (const StorageError& err) {
    throw StorageError(fmt::format("--export {}: {}", e.name, err.what()));
  }
  const DatasetInfo& info = ex->source->info();
  ex->identity = fmt::format("solar-stored export {} of {}", e.name, ex->source->identity());
  const std::uint64_t bytes = info.samples * info.sample_bytes;
  if (auto off = ex->source->raw_offset(); off && bytes > 0 && opt.in_memory) {
    load_into_memory(*ex);
  } else if (off && bytes > 0) {
    const int fd = ::open(e.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      throw StorageError(fmt::format("--export {}: {}: {}", e.name, e.path, std::strerror(errno)));
    const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    const std::uint64_t aligned = *off / page * page;
    ex->map_len = bytes + (*off - aligned);
    ex->map = ::mmap(nullptr, ex->map_len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(aligned));
    ::close(fd);
    if (ex->map == MAP_FAILED) {
      ex->map = nullptr;
      throw StorageError(fmt::format("--export {}: cannot map {}: {}", e.name, e.path,
                                     std::strerror(errno)));
    }
    ex->data = static_cast<const std::byte*>(ex->map) + (*off - aligned);
    ex->rma = true;  // registered per connection (Grant): exactly the data region
  } else {
    staging_bytes = std::max(staging_bytes, info.sample_bytes);
  }
  if (info.has_labels && info.samples) {
    ex->labels.resize(info.samples * info.label_bytes);
    const SampleRun all{0, info.samples};
    ex->source->read_labels({&all, 1}, ex->labels.data());
  }
  spdlog::info("export {}: {} ({} samples of {} {}, {} B each, {}; {})", e.name,
               ex->source->describe(), info.samples, info.shape_string(), to_string(info.dtype),
               info.sample_bytes, info.layout,
               ex->in_memory ? "one-sided RMA from the server's memory"
               : ex->rma     ? "one-sided RMA from the mapped file"
                             : "staged reads");
  exports.push_back(std::move(ex));
}

// --in-memory: the data is read once, at start, into anonymous memory of the server's own (on
// huge pages where the kernel gives them), and clients read that copy. Page-cache pages cost
// clients more to copy out than anonymous ones: shm reads of the copy ran 1.3-1.4x those of
// the mapped file, 256 KiB to 16 MiB samples (bench/README.md). The copy is
// read with O_DIRECT where the file system allows it, so the node does not hold it twice, and
// from a second handle whose identity must match the export's: a file replaced between the
// two opens is refused rather than served as the export's.
void StorageServer::Impl::load_into_memory(Exported& ex) {
  const DatasetInfo& info = ex.source->info();
  const std::uint64_t bytes = info.samples * info.sample_bytes;
  const std::string& name = ex.spec.name;
  constexpr std::uint64_t kReserve = 256ULL << 20;  // left to the job and the kernel
  if (const std::uint64_t avail = mem_available_bytes(); bytes + kReserve > avail)
    throw StorageError(fmt::format(
        "--in-memory: export {} needs {} of memory, and {} is available (keeping {} for the "
        "rest): serve it from its file (without --in-memory), or free memory",
        name, format_bytes(bytes), format_bytes(avail), format_bytes(kReserve)));
  constexpr std::size_t kHuge = 2ULL << 20;
  ex.map_len = (bytes + kHuge - 1) / kHuge * kHuge;
  ex.map = ::mmap(nullptr, ex.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ex.map == MAP_FAILED) {
    ex.map = nullptr;
    throw StorageError(fmt::format("--in-memory: export {}: cannot allocate {}: {}", name,
                                   format_bytes(bytes), std::strerror(errno)));
  }
  ::madvise(ex.map, ex.map_len, MADV_HUGEPAGE);  // best effort: THP may be off
  Hdf5Options ho;
  ho.label_dataset.clear();
  ho.io_threads = 4;
  ho.direct = true;
  std::unique_ptr<Hdf5Source> loader;
  try {
    loader = Hdf5Source::open(ex.spec.path, ex.spec.dataset, ho);
  } catch (const StorageError& err) {
    throw StorageError(fmt::format("--export {}: {}", name, err.what()));
  }
  if (loader->identity() != ex.source->identity())
    throw StorageError(fmt::format("--export {}: the file changed while it was opened ({}, then "
                                   "{}); start the server on a file nobody rewrites",
                                   name, ex.source->identity(), loader->identity()));
  spdlog::info("export {}: loading {} into memory", name, format_bytes(bytes));
  const auto start = std::chrono::steady_clock::now();
  auto shown = start;
  auto* dst = static_cast<std::byte*>(ex.map);
  const std::uint64_t step = std::max<std::uint64_t>(1, (256ULL << 20) / info.sample_bytes);
  for (std::uint64_t first = 0; first < info.samples; first += step) {
    const SampleRun run{first, std::min(step, info.samples - first)};
    try {
      loader->read({&run, 1}, dst + first * info.sample_bytes);  // checks the file after
    } catch (const StorageError& err) {
      throw StorageError(fmt::format("--export {}: loading into memory: {}", name, err.what()));
    }
    if (const auto now = std::chrono::steady_clock::now(); now - shown > std::chrono::seconds(5)) {
      shown = now;
      spdlog::info("export {}: {} of {} loaded", name,
                   format_bytes((first + run.count) * info.sample_bytes), format_bytes(bytes));
    }
  }
  ::mprotect(ex.map, ex.map_len, PROT_READ);  // served read-only from here on
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("export {}: {} loaded into memory in {:.1f} s ({:.2f} GB/s)", name,
               format_bytes(bytes), s, s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0.0);
  ex.data = static_cast<const std::byte*>(ex.map);
  ex.in_memory = true;
  ex.rma = true;
}

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

// Mapped exports are read by clients without the server's CPU, so a file rewritten in place is
// caught here (twice a second) rather than at a read: the export stops being served.
void StorageServer::Impl::watch_exports() {
  for (auto& ex : exports) {
    if (!ex->rma || ex->changed.load(std::memory_order_acquire)) continue;
    try {
      ex->source->check_unchanged();
      continue;
    } catch (const StorageError& e) {
      ex->changed_why = e.what();
    }
    ex->changed.store(true, std::memory_order_release);
    spdlog::error("export {} withdrawn: {}", ex->spec.name, ex->changed_why);
    std::lock_guard g(conns_mu);
    for (auto& c : conns)
      if (c.reading.load() == ex.get()) ::shutdown(c.socket->native_handle(), SHUT_RDWR);
  }
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
    if (live >= opt.max_clients) {
      reply = {{"ok", false}, {"retry", true},
               {"error", fmt::format("server busy: {} clients connected (--max-clients); try "
                                     "again", live)}};
    } else {
      c = &conns.emplace_back();
      c->socket = g.sock;
      c->reading = ex;
    }
  }
  if (c && ex->changed.load(std::memory_order_acquire))  // withdrawn meanwhile: no keys
    reply = {{"ok", false},
             {"error", "dataset '" + ex->spec.name + "' is withdrawn: " + ex->changed_why}};
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
    if (const char* failed = write_file_atomically(
            im.opt.ready_file, fmt::format("{}:{}\n", im.opt.host, im.port), 0666))
      throw StorageError(fmt::format("--ready-file {}: {}: {}", im.opt.ready_file, failed,
                                     std::strerror(errno)));
  im.io.run();
  im.reap(true);
}

}  // namespace solar::storage

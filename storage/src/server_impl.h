// SPDX-License-Identifier: Apache-2.0
// StorageServer's private parts, shared by its files: the exports and the memory clients read
// them from (Exported), what one authenticated connection may read (Grant), the staging slots,
// the raw-fabric reference's plain memory, and StorageServer::Impl, which owns them, the
// endpoint, the io thread's acceptor and the connections. Who does what:
//   server.cpp          start (endpoint, exports, progress thread), run and stop; accepting,
//                       the hello on the io thread, refusals, a thread per client
//   server_exports.cpp  --export parsing, opening an export (mapped or staged, --in-memory),
//                       watching exported files for changes
//   server_session.cpp  one authenticated client: the hello reply, its grant, its requests
//                       (stage, done, drop_cache, reference), staging slots, reference buffer
#pragma once

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

#include "solar/storage/fabric.h"
#include "solar/core/config.h"
#include "solar/core/plan_file.h"
#include "solar/storage/hdf5_source.h"
#include "wire.h"

namespace solar::storage {
namespace asio = boost::asio;
using asio::ip::tcp;
using nlohmann::json;

// One exported dataset and the memory clients read it from.
struct Exported {
  Export spec;
  std::unique_ptr<SampleSource> source;
  Hdf5Source* file = nullptr;  // a single file's source (the same object), else null
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

}  // namespace solar::storage

// libsolar: see solar.h. Two paths behind one API: batches from the node agent's shared buffer
// (the plan's samples, handed out as slots), or the same samples read directly from storage.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "direct_source.h"
#include "solar/core/plan_file.h"
#include "solar/protocol.h"
#include "solar/solar.h"
#include "solar/storage/sample_source.h"
#include "solar/unix_socket.h"

#ifdef SOLAR_WITH_CUDA
#include <dlfcn.h>
#endif

namespace {

thread_local std::string g_last_error;

class ClientError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string env(const char* name, const char* fallback = nullptr) {
  const char* v = std::getenv(name);
  if (v) return v;
  if (fallback) return fallback;
  throw ClientError(fmt::format("{} is not set: run under `solar run` or `srun --solar-*`, or set "
                                "it (see solar.h)",
                                name));
}

// A whole number from the environment; nullopt when neither `name` nor `alt` is set.
std::optional<std::uint32_t> env_u32(const char* name, const char* alt = nullptr) {
  const char* v = std::getenv(name);
  const char* shown = name;
  if (!v && alt) {
    v = std::getenv(alt);
    shown = alt;
  }
  if (!v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const unsigned long x = std::strtoul(v, &end, 10);
  if (errno || end == v || *end || *v == '-' || x > 0xffffffffUL)
    throw ClientError(fmt::format("{}='{}' is not a non-negative integer", shown, v));
  return static_cast<std::uint32_t>(x);
}

// The launcher variable that says this process is one of several, if any ("WORLD_SIZE=4").
std::string multi_process_launch() {
  for (const char* name : {"WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE",
                           "PMI_SIZE"}) {
    const char* v = std::getenv(name);
    if (v && std::strtoul(v, nullptr, 10) > 1) return fmt::format("{}={}", name, v);
  }
  return {};
}

// FNV-1a, 64 bits: the plan's fingerprint.
struct Fnv {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  template <class T>
  void add(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    unsigned char b[sizeof v];
    std::memcpy(b, &v, sizeof v);
    for (unsigned char c : b) h = (h ^ c) * 0x100000001b3ULL;
  }
};

// SOLAR_AGENT_TIMEOUT: how long a rank waits for any reply of its agent (seconds; 0: no limit).
constexpr double kDefaultAgentTimeout = 60;

double agent_timeout_from_env() {
  const char* v = std::getenv("SOLAR_AGENT_TIMEOUT");
  if (!v || !*v) return kDefaultAgentTimeout;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v, &end);
  if (errno || end == v || *end || !(x >= 0) || x > 1e9)
    throw ClientError(fmt::format("SOLAR_AGENT_TIMEOUT='{}' is not a number of seconds (the "
                                  "longest wait for the node agent; 0 for no limit)",
                                  v));
  return x;
}

// Exactly n bytes or an error (EINTR retried); errno is 0 when the peer closed the connection.
bool write_all(int fd, const void* p, std::size_t n) {
  const auto* c = static_cast<const char*>(p);
  while (n) {
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// Calls f(i, k) for each run [i, k) of a batch's samples (or labels) that lie one after another
// in memory, `each` bytes apart: a ring's batch of samples whose size is a multiple of 64 is one
// run (slots hold the samples alone, labels apart), and so are its labels; each run is then
// copied at once, not sample by sample.
template <class F>
void for_each_run(const std::vector<const std::byte*>& from, std::size_t each, F&& f) {
  for (std::size_t i = 0; i < from.size();) {
    std::size_t k = i + 1;
    while (k < from.size() && from[k] == from[i] + (k - i) * each) ++k;
    f(i, k);
    i = k;
  }
}

bool read_all(int fd, void* p, std::size_t n) {
  auto* c = static_cast<char*>(p);
  while (n) {
    const ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) errno = 0;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

#ifdef SOLAR_WITH_CUDA
// The CUDA runtime, opened on first use (dlopen): a rank without a GPU, or with its own CUDA
// (PyTorch's), loads nothing of ours. The few calls used are declared here, with the runtime
// API's values, so building needs no CUDA toolkit either. $SOLAR_CUDART names the library to
// use; otherwise one already loaded in the process (e.g. by PyTorch) or the system's.
struct Cuda {
  using Err = int;                               // cudaError_t; 0 = cudaSuccess
  static constexpr unsigned kRegisterPortable = 1, kRegisterReadOnly = 8;
  static constexpr int kHostToDevice = 1;        // cudaMemcpyHostToDevice
  Err (*GetDeviceCount)(int*) = nullptr;
  const char* (*GetErrorString)(Err) = nullptr;
  Err (*HostRegister)(void*, std::size_t, unsigned) = nullptr;
  Err (*HostUnregister)(void*) = nullptr;
  Err (*GetLastError)() = nullptr;
  Err (*MemcpyAsync)(void*, const void*, std::size_t, int, void*) = nullptr;
  std::string missing;  // why it could not be loaded ("" = loaded)

  Cuda() {
    std::vector<std::string> names;
    if (const char* e = std::getenv("SOLAR_CUDART"); e && *e) names.emplace_back(e);
    for (const char* n : {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                          "libcudart.so.11.0"})
      names.emplace_back(n);
    void* h = nullptr;
    for (const auto& n : names)  // one the process already has first
      if ((h = ::dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD))) break;
    for (std::size_t i = 0; !h && i < names.size(); ++i)
      h = ::dlopen(names[i].c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      missing = "the CUDA runtime (libcudart) is not installed or not on the library path "
                "(set SOLAR_CUDART to it)";
      return;
    }
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name));
      if (!fn && missing.empty()) missing = fmt::format("libcudart has no {}", name);
    };
    get(GetDeviceCount, "cudaGetDeviceCount");
    get(GetErrorString, "cudaGetErrorString");
    get(HostRegister, "cudaHostRegister");
    get(HostUnregister, "cudaHostUnregister");
    get(GetLastError, "cudaGetLastError");
    get(MemcpyAsync, "cudaMemcpyAsync");
  }
};

const Cuda& cuda() {
  static const Cuda c;
  return c;
}
#endif

// What a rank says of a reply in another protocol version than its own.
std::string other_version_text(const solar::protocol::Header& h) {
  return fmt::format("the agent speaks protocol version {}, this libsolar ({}) version {}: the "
                     "agent and libsolar come from different solar builds; install both from one",
                     h.version, SOLAR_VERSION_STRING, solar::protocol::kVersion);
}

}  // namespace

struct solar_loader;

struct solar_batch {
  solar_loader* loader = nullptr;
  std::uint64_t step = 0;
  std::uint32_t epoch = 0;
  double mean_size = 0;
  std::vector<std::uint32_t> samples;
  std::vector<const std::byte*> data;
  std::vector<const std::byte*> labels;
  std::vector<std::byte> own, own_labels;  // the direct path's memory
};

struct solar_loader {
  solar::PlanHeader header;
  solar::NodePlan plan;
  std::uint32_t node = 0, local_rank = 0, R = 0;
  std::uint64_t T = 0;
  std::string dataset, labels, socket_path;
  std::unique_ptr<solar::storage::SampleSource> source;  // direct path, opened on first use
  std::uint64_t sample_bytes = 0, label_bytes = 0;
  // What a sample's bytes are (solar_sample_shape, solar_sample_dtype, solar_label_dtype): from
  // the agent's hello, or the source when reading directly. Empty names / no shape: unknown.
  std::string dtype, label_dtype;
  std::optional<std::vector<std::uint64_t>> shape;

  int sock = -1;
  double agent_timeout = kDefaultAgentTimeout;  // seconds, 0: none (SOLAR_AGENT_TIMEOUT)
  std::byte* base = nullptr;
  std::size_t map_bytes = 0;
  solar::protocol::HelloOk hello{};

  std::uint64_t cursor = 0;
  // Resume: SOLAR_START_EPOCH / SOLAR_START_STEP were set (the launcher's or the plugin's start);
  // without them the rank starts where its agent does (the hello reply's start_step).
  bool start_given = false;
  std::uint64_t first = 0;  // the step the loader started at
  bool holding = false;
  bool holding_from_agent = false;
  // Releases are sent with the next write to the agent (steps release_step ..
  // release_step + releases_pending - 1, in order); close() flushes them.
  std::uint64_t releases_pending = 0;
  std::uint64_t release_step = 0;
  void note_release(std::uint64_t step) {
    if (releases_pending++ == 0) release_step = step;
  }
  // Asking ahead (protocol version 3): steps < asked were asked of the agent. Each write asks
  // for the steps after the one the rank takes, as many as the agent's hello says (its ring
  // depth minus one; 1 from an agent that does not say), so that their replies are there by
  // the next calls, with the releases owed. With the hello's defer_releases (small batches),
  // only a call that finds exactly one reply left to take (the one it takes now) asks: the
  // replies come back together while the rank uses this batch, one write, one receive and one
  // wake-up per ask_ahead + 1 batches instead of per batch, and no wait when the agent keeps
  // up. A call that finds none sends only the releases it holds (the agent counts the rank's
  // wait from there) and waits for the reply it asked for. Otherwise every call writes.
  static constexpr std::uint64_t kMaxAskAhead = solar::protocol::kMaxStepsAsked - 1;
  std::uint64_t ask_ahead = 1;
  std::uint64_t asked = 0;
  // Replies received, not yet taken: rx[rx_begin, rx_end). One receive takes whatever has
  // arrived (a header and its payload together, or several replies).
  std::vector<std::uint8_t> rx;
  std::size_t rx_begin = 0, rx_end = 0;
  solar_batch batch;

  std::span<const std::uint32_t> planned(std::uint64_t t) const {
    const std::uint64_t i = t * R + local_rank;
    return {plan.accesses.data() + plan.rank_offsets[i],
            plan.rank_offsets[i + 1] - plan.rank_offsets[i]};
  }

  void open_source() {
    if (source) return;
    solar::storage::SourceOptions so;
    so.label_dataset = labels;
    so.expect_identity = header.dataset_identity;  // never another file's bytes
    // The plan was made from this dataset: a solar-stored restarting right now (the moment
    // this rank's agent is gone) is waited for, as a lost server is, not an error at once.
    so.wait_for_server = true;
    source = solar::client::open_direct_source(dataset, so);
    const auto& info = source->info();
    if (info.samples != header.config.samples || info.sample_bytes != header.config.sample_bytes)
      throw ClientError(fmt::format("{} has {} samples of {} bytes, the plan expects {} of {}",
                                    source->describe(), info.samples, info.sample_bytes,
                                    header.config.samples, header.config.sample_bytes));
    if (sample_bytes == 0) {
      sample_bytes = info.sample_bytes;
      label_bytes = info.has_labels ? info.label_bytes : 0;
      dtype = solar::storage::to_string(info.dtype);
      label_dtype = info.has_labels ? std::string(solar::storage::to_string(info.label_dtype)) : "";
      shape = info.sample_shape;
    } else if (label_bytes != (info.has_labels ? info.label_bytes : 0)) {
      throw ClientError(fmt::format("{}: label size differs from the agent's", source->describe()));
    }
  }

  void drop_agent(const std::string& why) {
    if (sock >= 0) {
      ::close(sock);
      sock = -1;
      std::fprintf(stderr,
                   "solar: rank %u: %s; continuing from step %llu by reading %s directly "
                   "(same samples, same order)\n",
                   header.config.ranks_per_node * node + local_rank, why.c_str(),
                   static_cast<unsigned long long>(cursor), dataset.c_str());
    }
  }

  // Why the agent stopped answering, from the errno of a failed send or receive.
  std::string agent_gone(int err) const {
    if (err == EAGAIN || err == EWOULDBLOCK)
      return fmt::format("the agent did not answer within {:g} s (SOLAR_AGENT_TIMEOUT)",
                         agent_timeout);
    return "the agent went away";
  }

  // Connects and says hello; on any failure stays on the direct path. Every wait for the agent
  // (the connection, each reply) is bounded by SOLAR_AGENT_TIMEOUT: a stopped or overloaded
  // agent makes the rank read directly, never hang.
  void attach() {
    using solar::protocol::UnixConnection;
    const UnixConnection conn =
        solar::protocol::connect_unix(socket_path, {.timeout_s = agent_timeout});
    if (conn.failed == UnixConnection::Failed::path_too_long ||
        conn.failed == UnixConnection::Failed::socket) {
      std::fprintf(stderr, "solar: SOLAR_SOCKET path too long; reading directly\n");
      return;
    }
    if (!conn) {
      const int err = conn.error;
      if (err == EAGAIN)
        std::fprintf(stderr,
                     "solar: the agent at %s accepted no connection within %g s "
                     "(SOLAR_AGENT_TIMEOUT); reading %s directly\n",
                     socket_path.c_str(), agent_timeout, dataset.c_str());
      else
        std::fprintf(stderr, "solar: no agent at %s (%s); reading %s directly\n",
                     socket_path.c_str(), std::strerror(err), dataset.c_str());
      return;
    }
    const int fd = conn.fd;
    sock = fd;
    const solar::protocol::Hello hi{local_rank, static_cast<std::uint32_t>(::getpid())};
    char out[sizeof(solar::protocol::Header) + sizeof hi];
    if (!write_all(fd, out, solar::protocol::put_frame(out, solar::protocol::Op::hello, &hi, sizeof hi)))
      return drop_agent(errno == EAGAIN ? agent_gone(errno) : "the agent closed the connection");
    // The reply's header carries the buffer's fd; then its payload.
    solar::protocol::Header rh;
    struct iovec iov{&rh, sizeof rh};
    alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    struct msghdr mh {};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    ssize_t n;
    do n = ::recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    while (n < 0 && errno == EINTR);
    const int err = n < 0 ? errno : 0;
    int memfd = -1;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
      if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
        std::memcpy(&memfd, CMSG_DATA(cm), sizeof(int));
    auto refused = [&](const std::string& why) {
      if (memfd >= 0) ::close(memfd);
      drop_agent(why);
    };
    if (n != static_cast<ssize_t>(sizeof rh))
      return refused(err == EAGAIN || err == EWOULDBLOCK
                         ? agent_gone(err)
                         : std::string("the agent closed the connection without answering (see "
                                       "its log)"));
    if (solar::protocol::other_version(rh)) {
      // An agent of another build: its error frame (an agent of version 2 or later sends one)
      // says why; either way this libsolar cannot read its replies.
      std::string why;
      if (rh.op == static_cast<std::uint16_t>(solar::protocol::Op::error) &&
          rh.length <= 4096) {
        std::vector<char> text(rh.length);
        if (read_all(fd, text.data(), text.size())) why = std::string(text.begin(), text.end());
      }
      return refused(why.empty() ? other_version_text(rh)
                                 : "the agent refused this rank: " + why);
    }
    std::vector<std::uint8_t> body(solar::protocol::acceptable(rh) ? rh.length : 0);
    if (!solar::protocol::acceptable(rh) || !read_all(fd, body.data(), body.size()))
      return refused(solar::protocol::acceptable(rh) ? agent_gone(errno)
                                                     : "unexpected reply from the agent");
    if (rh.op == static_cast<std::uint16_t>(solar::protocol::Op::error))
      return refused("the agent refused this rank: " + std::string(body.begin(), body.end()));
    if (rh.op != static_cast<std::uint16_t>(solar::protocol::Op::hello_ok) ||
        body.size() != sizeof hello || memfd < 0)
      return refused("unexpected reply from the agent");
    std::memcpy(&hello, body.data(), sizeof hello);
    if (hello.total_steps != T || hello.ranks_per_node != R || hello.samples != header.config.samples) {
      ::close(memfd);
      return drop_agent("the agent serves a different plan");
    }
    if (hello.start_step > T) {
      ::close(memfd);
      return drop_agent("the agent's start step is beyond the plan");
    }
    if (!start_given) {
      cursor = hello.start_step;  // the agent serves steps from its start on
    } else if (hello.start_step > cursor) {
      ::close(memfd);
      return drop_agent(fmt::format("the agent starts at step {} but this rank at step {} "
                                    "(SOLAR_START_EPOCH/SOLAR_START_STEP): it does not serve the "
                                    "steps in between",
                                    hello.start_step, cursor));
    }
    // Samples in slots, then the labels (version 4); a layout that does not add up is not
    // mapped.
    const std::uint64_t samples_end = hello.slots * hello.slot_bytes;
    if (hello.slot_bytes < hello.sample_bytes ||
        (hello.label_bytes && hello.labels_offset < samples_end)) {
      ::close(memfd);
      return drop_agent("the agent's buffer layout is inconsistent");
    }
    map_bytes = hello.label_bytes ? hello.labels_offset + hello.slots * hello.label_bytes
                                  : samples_end;
    // Not MAP_POPULATE: populating the whole buffer up front costs more than it saves (on
    // shadow-paged VMs, 3x more on the first pass over the buffer).
    void* p = ::mmap(nullptr, map_bytes, PROT_READ, MAP_SHARED, memfd, 0);
    ::close(memfd);
    if (p == MAP_FAILED) return drop_agent(fmt::format("mapping the buffer failed: {}",
                                                       std::strerror(errno)));
    base = static_cast<std::byte*>(p);
    sample_bytes = hello.sample_bytes;
    label_bytes = hello.label_bytes;
    ask_ahead = std::clamp<std::uint64_t>(hello.ask_ahead, 1, kMaxAskAhead);
    dtype.assign(hello.dtype, strnlen(hello.dtype, sizeof hello.dtype));
    label_dtype.assign(hello.label_dtype, strnlen(hello.label_dtype, sizeof hello.label_dtype));
    if (hello.shape_dims <= solar::protocol::HelloOk::kMaxShapeDims)
      shape.emplace(hello.shape, hello.shape + hello.shape_dims);
    // This rank starts after the agent's start: the agent runs its plan in order, so the
    // steps in between are taken and released (read by the agent, not copied here).
    const std::uint64_t want = cursor;
    cursor = asked = hello.start_step;
    skip_with_agent(want);
  }

  // Takes and releases the agent's steps from the cursor up to `step` (the agent runs its plan
  // in order); once the agent is gone the rest is a cursor move.
  void skip_with_agent(std::uint64_t step) {
    while (cursor < step && sock >= 0) {
      if (!next_from_agent()) break;
      note_release(cursor);
      ++cursor;
    }
    cursor = std::max(cursor, step);
  }

  // An agent that stops after a failure (e.g. its dataset file changed) sends one error frame
  // before it closes the connection: its reason, when it is there to read without waiting.
  // Replies to steps asked ahead (next_from_agent) may come before it: every whole frame
  // received is looked at. Only for a connection being dropped (it consumes what it reads).
  std::optional<std::string> last_words() {
    for (;;) {  // whatever has arrived, without waiting
      if (rx.size() - rx_end < 16384) rx.resize(rx_end + 16384);
      const ssize_t r = ::recv(sock, rx.data() + rx_end, rx.size() - rx_end, MSG_DONTWAIT);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      rx_end += static_cast<std::size_t>(r);
    }
    solar::protocol::Header rh;
    for (std::size_t at = rx_begin; rx_end - at >= sizeof rh;) {
      std::memcpy(&rh, rx.data() + at, sizeof rh);
      if (!solar::protocol::acceptable(rh) || rx_end - at < sizeof rh + rh.length) break;
      if (rh.op == static_cast<std::uint16_t>(solar::protocol::Op::error))
        return "the agent refused: " +
               std::string(rx.begin() + static_cast<std::ptrdiff_t>(at + sizeof rh),
                           rx.begin() + static_cast<std::ptrdiff_t>(at + sizeof rh + rh.length));
      at += sizeof rh + rh.length;
    }
    return std::nullopt;
  }

  // The next reply frame: true with its header and payload (valid until the next call), false
  // with errno set when the connection failed (0: closed by the agent) or, with errno EPROTO,
  // when the bytes are not a reply of this protocol version (`bad` says what they are).
  bool receive(solar::protocol::Header& h, std::span<const std::uint8_t>& payload,
               std::string& bad) {
    for (;;) {
      const std::size_t have = rx_end - rx_begin;
      std::size_t need = sizeof h;
      if (have >= sizeof h) {
        std::memcpy(&h, rx.data() + rx_begin, sizeof h);
        if (!solar::protocol::acceptable(h)) {
          bad = solar::protocol::other_version(h) ? other_version_text(h)
                                                  : std::string("unexpected reply from the agent");
          errno = EPROTO;
          return false;
        }
        need += h.length;
        if (have >= need) {
          payload = {rx.data() + rx_begin + sizeof h, h.length};
          rx_begin += need;
          if (rx_begin == rx_end) rx_begin = rx_end = 0;
          return true;
        }
      }
      if (rx_begin > 0) {  // keep the partial frame at the front
        std::memmove(rx.data(), rx.data() + rx_begin, have);
        rx_begin = 0;
        rx_end = have;
      }
      if (rx.size() < std::max<std::size_t>(need, 16384)) rx.resize(std::max<std::size_t>(need, 16384));
      const ssize_t r = receive_some();
      if (r == 0) errno = 0;
      if (r <= 0) return false;
      rx_end += static_cast<std::size_t>(r);
    }
  }

  // One recv into rx, waiting at most SOLAR_AGENT_TIMEOUT (errno EAGAIN past it). It waits in
  // poll for POLLIN, not in a blocking recv: a task blocked in recv on a Unix socket sleeps on
  // the queue that the agent's reading of this rank's requests wakes for write space
  // (unix_write_space), so each request the agent took would wake the rank for nothing, an
  // interrupt and two context switches; poll's wait is woken only for the events it asked for.
  ssize_t receive_some() {
    for (;;) {
      const ssize_t r = ::recv(sock, rx.data() + rx_end, rx.size() - rx_end, MSG_DONTWAIT);
      if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return r;
      if (errno == EINTR) continue;
      pollfd p{sock, POLLIN, 0};
      const int ms = agent_timeout > 0
                         ? static_cast<int>(std::min(std::ceil(agent_timeout * 1000), 2e9))
                         : -1;
      const int n = ::poll(&p, 1, ms);
      if (n == 0) {
        errno = EAGAIN;
        return -1;
      }
      if (n < 0 && errno != EINTR) return -1;
    }
  }

  // Whole frames received and not yet taken (each a reply to one step asked, or `end`).
  std::size_t replies_received() const {
    std::size_t n = 0;
    solar::protocol::Header h;
    for (std::size_t at = rx_begin; rx_end - at >= sizeof h; ++n) {
      std::memcpy(&h, rx.data() + at, sizeof h);
      if (rx_end - at - sizeof h < h.length) break;
      at += sizeof h + h.length;
    }
    return n;
  }

  // The agent path: true with the batch filled, false if the agent is gone (fall back). One
  // write (see asked above for when): the releases owed, and the requests for this step
  // (unless asked already) and for ask_ahead steps after it within the plan; then this step's
  // reply, usually already received.
  bool next_from_agent() {
    if (sock < 0) return false;
    constexpr std::size_t kFrame = sizeof(solar::protocol::Header) + 8;
    char out[(2 + 2 * kMaxAskAhead) * kFrame];
    const std::size_t here = hello.defer_releases ? replies_received() : 0;
    const bool ask = asked <= cursor || !hello.defer_releases || releases_pending > ask_ahead ||
                     here == 1;
    // Nothing here to take: the releases it holds say that it waits now (the agent measures
    // the ranks' waits from there), without asking for more.
    const bool waits = here == 0 && releases_pending > 0;
    if (ask || waits) {
      std::size_t len = put_releases(out);
      asked = std::max(asked, cursor);
      for (const std::uint64_t upto = std::min(T, cursor + 1 + ask_ahead); ask && asked < upto;
           ++asked) {
        const solar::protocol::Next nx{asked};
        len += solar::protocol::put_frame(out + len, solar::protocol::Op::next, &nx, sizeof nx);
      }
      if (len && !write_all(sock, out, len)) {
        const int err = errno;
        drop_agent(last_words().value_or(agent_gone(err)));
        return false;
      }
    }
    solar::protocol::Header rh;
    std::span<const std::uint8_t> payload;
    std::string bad;
    if (!receive(rh, payload, bad)) {
      drop_agent(errno == EPROTO ? bad : agent_gone(errno));
      return false;
    }
    const auto op = static_cast<solar::protocol::Op>(rh.op);
    if (op == solar::protocol::Op::error) {
      drop_agent("the agent refused: " + std::string(payload.begin(), payload.end()));
      return false;
    }
    solar::protocol::BatchHead bh;
    if (op != solar::protocol::Op::batch || payload.size() < sizeof bh) {
      drop_agent("unexpected reply from the agent");
      return false;
    }
    std::memcpy(&bh, payload.data(), sizeof bh);
    const auto want = planned(cursor);
    if (bh.step != cursor || bh.count != want.size() ||
        payload.size() != sizeof bh + bh.count * sizeof(solar::protocol::BatchEntry)) {
      drop_agent("the agent's batch does not match the plan");
      return false;
    }
    batch.data.resize(bh.count);
    batch.labels.resize(bh.count);
    for (std::uint32_t i = 0; i < bh.count; ++i) {
      solar::protocol::BatchEntry e;
      std::memcpy(&e, payload.data() + sizeof bh + i * sizeof e, sizeof e);
      if (e.sample != (want[i] & solar::kSampleMask) || e.slot >= hello.slots) {
        drop_agent("the agent's batch does not match the plan");
        return false;
      }
      batch.data[i] = base + std::uint64_t{e.slot} * hello.slot_bytes;
      batch.labels[i] =
          label_bytes ? base + hello.labels_offset + std::uint64_t{e.slot} * label_bytes : nullptr;
    }
    return true;
  }

  void next_direct() {
    open_source();
    const std::size_t n = batch.samples.size();
    std::vector<std::uint64_t> ids(batch.samples.begin(), batch.samples.end());
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    const auto runs = solar::storage::coalesce(ids);
    batch.own.resize(ids.size() * sample_bytes);
    source->read(runs, batch.own.data());
    if (label_bytes) {
      batch.own_labels.resize(ids.size() * label_bytes);
      source->read_labels(runs, batch.own_labels.data());
    }
    batch.data.resize(n);
    batch.labels.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(
          std::lower_bound(ids.begin(), ids.end(), batch.samples[i]) - ids.begin());
      batch.data[i] = batch.own.data() + k * sample_bytes;
      batch.labels[i] = label_bytes ? batch.own_labels.data() + k * label_bytes : nullptr;
    }
  }

  // The releases owed, as frames at `out` (room for ask_ahead + 1 of them); their length.
  std::size_t put_releases(char* out) {
    std::size_t len = 0;
    for (; releases_pending > 0; --releases_pending, ++release_step) {
      const solar::protocol::Release rl{release_step};
      len += solar::protocol::put_frame(out + len, solar::protocol::Op::release, &rl, sizeof rl);
    }
    return len;
  }

  bool pinned = false;           // the shared buffer is registered with CUDA
  bool base_pin_failed = false;  // tried once, copies go unpinned

  ~solar_loader() {
#ifdef SOLAR_WITH_CUDA
    if (pinned) cuda().HostUnregister(base);
#endif
    if (sock >= 0 && releases_pending) {
      char out[(kMaxAskAhead + 1) * (sizeof(solar::protocol::Header) + 8)];
      write_all(sock, out, put_releases(out));
    }
    if (sock >= 0) ::close(sock);
    if (base) ::munmap(base, map_bytes);
  }
};

extern "C" {

const char* solar_last_error(void) { return g_last_error.c_str(); }
const char* solar_version(void) { return SOLAR_VERSION_STRING; }

solar_loader* solar_open_env(void) {
  try {
    auto l = std::make_unique<solar_loader>();
    const char* plan_env = std::getenv("SOLAR_PLAN");
    if (!plan_env || !*plan_env)
      throw ClientError("SOLAR_PLAN is not set: run under `solar run` or `srun --solar-*`, or "
                        "make a plan (`solar plan --samples N --sample-bytes B --batch b "
                        "--epochs E --buffer X --out FILE`) and set SOLAR_PLAN to that file");
    const std::string plan_path = plan_env;
    const auto node = env_u32("SOLAR_NODE");
    const auto local_rank = env_u32("SOLAR_LOCAL_RANK", "LOCAL_RANK");
    const char* dataset_env = std::getenv("SOLAR_DATASET");
    if (!dataset_env || !*dataset_env)
      throw ClientError(fmt::format("SOLAR_DATASET is not set: set it to the dataset the plan {} "
                                    "was made for (FILE.h5[:/dataset] or "
                                    "fabric://HOST:PORT/NAME)",
                                    plan_path));
    l->dataset = dataset_env;
    l->labels = env("SOLAR_LABELS", "/label");
    const solar::PlanFile pf = solar::PlanFile::open(plan_path);
    l->header = pf.header();
    // Standalone (one process, no launcher): node 0, local rank 0. A process that a launcher
    // started as one of several must be told which rank it is: all of them being rank 0 would
    // train on the same samples.
    {
      const auto& c = l->header.config;
      const bool need_node = !node && c.nodes > 1;
      const bool need_rank = !local_rank && c.ranks_per_node > 1;
      if (need_node || need_rank) {
        const std::string missing = need_node && need_rank ? "SOLAR_NODE and SOLAR_LOCAL_RANK are"
                                    : need_node ? "SOLAR_NODE is"
                                                : "SOLAR_LOCAL_RANK (or LOCAL_RANK) is";
        if (const std::string launch = multi_process_launch(); !launch.empty())
          throw ClientError(fmt::format(
              "{} not set but this process is one of several ({}) and the plan {} has {} "
              "node{} x {} rank{} per node: run under `solar run` or `srun --solar-*`, or set "
              "{}",
              missing, launch, plan_path, c.nodes, c.nodes == 1 ? "" : "s", c.ranks_per_node,
              c.ranks_per_node == 1 ? "" : "s", need_node && need_rank ? "them" : "it"));
        std::fprintf(stderr,
                     "solar: %s not set: reading as node %u, local rank %u, one of the %llu "
                     "ranks of the plan %s (set %s to read another rank's batches)\n",
                     missing.c_str(), node.value_or(0), local_rank.value_or(0),
                     static_cast<unsigned long long>(c.world()), plan_path.c_str(),
                     need_node && need_rank ? "them" : "it");
      }
    }
    l->node = node.value_or(0);
    l->local_rank = local_rank.value_or(0);
    if (l->node >= l->header.config.nodes)
      throw ClientError(fmt::format("SOLAR_NODE={} but the plan {} has nodes 0..{}", l->node,
                                    plan_path, l->header.config.nodes - 1));
    l->R = l->header.config.ranks_per_node;
    if (l->local_rank >= l->R)
      throw ClientError(fmt::format("SOLAR_LOCAL_RANK={} but the plan has {} ranks per node",
                                    l->local_rank, l->R));
    l->plan = pf.node(l->node);
    l->T = std::uint64_t{l->header.layout.steps} * l->header.config.epochs;
    {  // Resume: where the launcher (solar run --start-*, srun --solar-start-*) starts the job.
      auto start_var = [](const char* name) -> std::optional<std::uint64_t> {
        const char* v = std::getenv(name);
        if (!v || !*v) return std::nullopt;
        try {
          return solar::parse_count(v, name, 0, ~std::uint64_t{0});
        } catch (const solar::ConfigError& e) {
          throw ClientError(e.what());
        }
      };
      const auto e = start_var("SOLAR_START_EPOCH"), st = start_var("SOLAR_START_STEP");
      if (e || st) {
        try {
          l->cursor = solar::start_global_step(e, st, l->header.layout.steps,
                                               l->header.config.epochs, "SOLAR_START_EPOCH",
                                               "SOLAR_START_STEP");
        } catch (const solar::ConfigError& err) {
          throw ClientError(fmt::format("{} (plan {})", err.what(), plan_path));
        }
        l->start_given = true;
      }
    }
    if (const char* s = std::getenv("SOLAR_SOCKET"); s && *s) {
      l->agent_timeout = agent_timeout_from_env();
      l->socket_path = s;
      l->attach();
    }
    if (l->sock < 0) l->open_source();  // fail now, not at the first batch
    l->first = l->cursor;
    g_last_error.clear();
    return l.release();
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return nullptr;
  }
}

void solar_close(solar_loader* l) { delete l; }

int solar_using_agent(const solar_loader* l) { return l && l->sock >= 0; }
uint32_t solar_epochs(const solar_loader* l) { return l->header.config.epochs; }
uint32_t solar_steps_per_epoch(const solar_loader* l) { return l->header.layout.steps; }
uint64_t solar_sample_bytes(const solar_loader* l) { return l->sample_bytes; }
uint64_t solar_label_bytes(const solar_loader* l) { return l->label_bytes; }
uint64_t solar_dataset_samples(const solar_loader* l) { return l->header.config.samples; }
int solar_sample_shape(const solar_loader* l, uint64_t* dims, int max_dims) {
  if (!l || !l->shape) return -1;
  const auto& sh = *l->shape;
  const std::size_t room = dims ? static_cast<std::size_t>(std::max(max_dims, 0)) : 0;
  for (std::size_t i = 0; i < sh.size() && i < room; ++i) dims[i] = sh[i];
  return static_cast<int>(sh.size());
}
const char* solar_sample_dtype(const solar_loader* l) { return l ? l->dtype.c_str() : ""; }
const char* solar_label_dtype(const solar_loader* l) { return l ? l->label_dtype.c_str() : ""; }
uint32_t solar_rank(const solar_loader* l) { return l->node * l->R + l->local_rank; }
uint32_t solar_world_size(const solar_loader* l) {
  return static_cast<uint32_t>(l->header.config.world());
}

int solar_next_batch(solar_loader* l, solar_batch** out) {
  try {
    if (!l || !out) throw ClientError("solar_next_batch: NULL argument");
    if (l->holding)
      throw ClientError(fmt::format("solar_next_batch: step {} is still held; call solar_release "
                                    "first",
                                    l->batch.step));
    if (l->cursor >= l->T) return 0;
    solar_batch& b = l->batch;
    b.loader = l;
    b.step = l->cursor;
    b.epoch = static_cast<std::uint32_t>(l->cursor / l->header.layout.steps);
    b.mean_size = l->header.layout.rank_batch(
        static_cast<std::uint32_t>(l->cursor % l->header.layout.steps));
    const auto want = l->planned(l->cursor);
    b.samples.resize(want.size());
    for (std::size_t i = 0; i < want.size(); ++i) b.samples[i] = want[i] & solar::kSampleMask;
    l->holding_from_agent = l->next_from_agent();
    if (!l->holding_from_agent) l->next_direct();
    ++l->cursor;
    l->holding = true;
    *out = &b;
    return 1;
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return -1;
  }
}

int solar_skip_to(solar_loader* l, uint64_t global_step) {
  try {
    if (!l) throw ClientError("solar_skip_to: NULL loader");
    if (l->holding)
      throw ClientError(fmt::format("solar_skip_to: step {} is still held; call solar_release "
                                    "first",
                                    l->batch.step));
    if (global_step > l->T)
      throw ClientError(fmt::format("solar_skip_to: step {} is beyond the end of the plan ({} "
                                    "steps: {} epochs of {})",
                                    global_step, l->T, l->header.config.epochs,
                                    l->header.layout.steps));
    if (global_step < l->first)
      throw ClientError(fmt::format("solar_skip_to: step {} is before step {}, where this "
                                    "launch started (SOLAR_START_EPOCH/SOLAR_START_STEP or the "
                                    "agent's start): its agent never serves earlier steps; "
                                    "launch the job at step {} (solar run --start-step, srun "
                                    "--solar-start-step)",
                                    global_step, l->first, global_step));
    if (global_step < l->cursor)
      throw ClientError(fmt::format("solar_skip_to: step {} was already served (the next step is "
                                    "{}); steps run forward only: open a new loader",
                                    global_step, l->cursor));
    // With an agent: it runs the plan in order, so the steps before are taken and released
    // (its reads happen; nothing is copied here). Without one (or once it is gone), or to the
    // step the loader is at (the agent's start after a resumed launch): a cursor move, no
    // reads.
    l->skip_with_agent(global_step);
    g_last_error.clear();
    return 0;
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return -1;
  }
}

uint64_t solar_position(const solar_loader* l) { return l->cursor; }
uint32_t solar_batch_per_rank(const solar_loader* l) { return l->header.config.batch; }

uint64_t solar_plan_fingerprint(const solar_loader* l) {
  const solar::PlanHeader& h = l->header;
  const solar::PlanConfig& c = h.config;
  Fnv f;
  for (std::uint64_t v : {c.samples, c.sample_bytes, c.seed, c.buffer_bytes}) f.add(v);
  for (std::uint32_t v : {c.epochs, c.nodes, c.ranks_per_node, c.batch, c.imbalance,
                          h.layout.steps, static_cast<std::uint32_t>(c.order),
                          static_cast<std::uint32_t>(c.policy), std::uint32_t{c.drop_last},
                          std::uint32_t{c.peer_fetch}})
    f.add(v);
  for (std::uint32_t e : h.epoch_order) f.add(e);
  // Each node section's checksum: every rank's batches and every node's schedule.
  for (const auto& d : h.directory) {
    f.add(d.length);
    f.add(d.crc);
  }
  return f.h;
}

int solar_release(solar_loader* l, solar_batch* b) {
  if (!l || b != &l->batch || !l->holding) {
    g_last_error = "solar_release: not the batch this loader handed out";
    return -1;
  }
  l->holding = false;
  if (l->holding_from_agent && l->sock >= 0) l->note_release(b->step);
  return 0;
}

size_t solar_batch_size(const solar_batch* b) { return b->samples.size(); }
uint64_t solar_batch_step(const solar_batch* b) { return b->step; }
uint32_t solar_batch_epoch(const solar_batch* b) { return b->epoch; }
uint64_t solar_batch_index(const solar_batch* b, size_t i) { return b->samples[i]; }
const void* solar_batch_sample(const solar_batch* b, size_t i) { return b->data[i]; }
const void* solar_batch_label(const solar_batch* b, size_t i) { return b->labels[i]; }
double solar_batch_mean_size(const solar_batch* b) { return b->mean_size; }

int solar_batch_gather(const solar_batch* b, void* data, size_t data_bytes, void* labels,
                       size_t labels_bytes) {
  if (!b || !b->loader) {
    g_last_error = "solar_batch_gather: NULL batch";
    return -1;
  }
  const solar_loader* l = b->loader;
  const std::size_t n = b->samples.size();
  const std::uint64_t sb = l->sample_bytes, lb = l->label_bytes;
  if (data && data_bytes < n * sb) {
    g_last_error = fmt::format("solar_batch_gather: the data buffer has {} bytes, the batch "
                               "needs {} ({} samples of {})",
                               data_bytes, n * sb, n, sb);
    return -1;
  }
  if (labels && !lb) {
    g_last_error = "solar_batch_gather: the dataset has no labels (pass NULL)";
    return -1;
  }
  if (labels && labels_bytes < n * lb) {
    g_last_error = fmt::format("solar_batch_gather: the labels buffer has {} bytes, the batch "
                               "needs {}",
                               labels_bytes, n * lb);
    return -1;
  }
  auto* dout = static_cast<std::byte*>(data);
  auto* lout = static_cast<std::byte*>(labels);
  if (dout)
    for_each_run(b->data, sb, [&](std::size_t i, std::size_t k) {
      std::memcpy(dout + i * sb, b->data[i], (k - i) * sb);
    });
  if (lout)
    for_each_run(b->labels, lb, [&](std::size_t i, std::size_t k) {
      std::memcpy(lout + i * lb, b->labels[i], (k - i) * lb);
    });
  return 0;
}

int solar_cuda_available(void) {
#ifdef SOLAR_WITH_CUDA
  const Cuda& cu = cuda();
  if (!cu.missing.empty()) {
    g_last_error = "no GPU: " + cu.missing;
    return 0;
  }
  int n = 0;
  const int e = cu.GetDeviceCount(&n);
  // Without a driver this is cudaErrorInsufficientDriver (35), not cudaErrorNoDevice (100).
  if (e != 0 || n == 0) {
    g_last_error = fmt::format("no GPU: {}", e == 0 ? "no device" : cu.GetErrorString(e));
    return 0;
  }
  return 1;
#else
  g_last_error = "libsolar was built without CUDA (SOLAR_WITH_CUDA off)";
  return 0;
#endif
}

int solar_batch_copy_to_device(const solar_batch* b, void* dst, void* stream) {
#ifdef SOLAR_WITH_CUDA
  if (!b || !b->loader || !dst) {
    g_last_error = "solar_batch_copy_to_device: NULL argument";
    return -1;
  }
  if (!solar_cuda_available()) return -1;
  solar_loader* l = b->loader;
  const Cuda& cu = cuda();
  if (!l->pinned && !l->base_pin_failed && l->base) {
    const int e = cu.HostRegister(l->base, l->map_bytes,
                                  Cuda::kRegisterPortable | Cuda::kRegisterReadOnly);
    l->pinned = e == 0;
    if (!l->pinned) {
      std::fprintf(stderr, "solar: pinning the shared buffer failed (%s); copies are staged\n",
                   cu.GetErrorString(e));
      cu.GetLastError();
      l->base_pin_failed = true;
    }
  }
  const std::uint64_t sb = l->sample_bytes;
  auto* out = static_cast<std::byte*>(dst);
  int e = 0;
  for_each_run(b->data, sb, [&](std::size_t i, std::size_t k) {
    if (e == 0) e = cu.MemcpyAsync(out + i * sb, b->data[i], (k - i) * sb, Cuda::kHostToDevice,
                                   stream);
  });
  if (e != 0) {
    g_last_error = fmt::format("solar_batch_copy_to_device: {}", cu.GetErrorString(e));
    return -1;
  }
  return 0;
#else
  (void)b;
  (void)dst;
  (void)stream;
  g_last_error = "libsolar was built without CUDA (SOLAR_WITH_CUDA off)";
  return -1;
#endif
}

}  // extern "C"

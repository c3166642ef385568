// SPDX-License-Identifier: Apache-2.0
// solar-stored: exports HDF5 datasets read-only over libfabric RMA (see storage/README.md).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <spdlog/pattern_formatter.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "solar/core/config.h"
#include "solar/storage/server.h"

namespace {

// --token-file: the token is the file's first line (surrounding blanks and the line end
// removed). The file must be a regular file of this user that nobody else may read, so that a
// token kept there is as private as the user's own key files.
std::string read_token_file(const std::string& path) {
  auto bad = [&](const std::string& why) { return solar::ConfigError("--token-file", path + ": " + why); };
  // O_NONBLOCK: a FIFO named here must not hang the start (it is then refused as not regular).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0)
    throw bad(errno == ELOOP ? "is a symbolic link; name the file itself"
                             : std::string(std::strerror(errno)));
  struct stat st {};
  std::string text(4097, '\0');
  ssize_t n = -1;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
      (st.st_mode & 077) == 0)
    n = ::read(fd, text.data(), text.size());
  const int err = errno;
  ::close(fd);
  if (!S_ISREG(st.st_mode)) throw bad("is not a regular file");
  if (st.st_uid != ::geteuid())
    throw bad(fmt::format("belongs to uid {}, not to uid {} that runs solar-stored; a token "
                          "file must be its server user's own",
                          st.st_uid, ::geteuid()));
  if ((st.st_mode & 077) != 0)
    throw bad(fmt::format("may be read by others (mode {:04o}); `chmod 600 {}`",
                          st.st_mode & 07777, path));
  if (n < 0) throw bad(std::strerror(err));
  if (n > 4096) throw bad("is longer than 4096 bytes; a token is one line");
  text.resize(static_cast<std::size_t>(n));
  text = text.substr(0, text.find('\n'));
  const auto a = text.find_first_not_of(" \t\r"), b = text.find_last_not_of(" \t\r");
  if (a == std::string::npos) throw bad("holds no token (its first line is empty)");
  return text.substr(a, b - a + 1);
}

// A token given as --token is overwritten in this process's argv, so that /proc/PID/cmdline
// (ps) no longer shows it once the server runs; it was visible until then.
bool scrub_token_argument(int argc, char** argv) {
  bool found = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    char* value = nullptr;
    if (a == "--token" && i + 1 < argc) value = argv[++i];
    else if (a.rfind("--token=", 0) == 0) value = argv[i] + 8;
    if (!value) continue;
    std::memset(value, 'x', std::strlen(value));
    found = true;
  }
  return found;
}

// systemd's readiness protocol (sd_notify(3)): one datagram to $NOTIFY_SOCKET, when systemd
// started the server with Type=notify; nothing otherwise.
void notify_systemd(const std::string& state) {
  const char* where = std::getenv("NOTIFY_SOCKET");
  if (!where || !*where) return;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::size_t len = std::strlen(where);
  if ((where[0] != '/' && where[0] != '@') || len >= sizeof addr.sun_path) {
    spdlog::warn("NOTIFY_SOCKET={}: not a socket path; not telling systemd '{}'", where, state);
    return;
  }
  std::memcpy(addr.sun_path, where, len);
  if (where[0] == '@') addr.sun_path[0] = '\0';  // the abstract namespace
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  const auto size = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len);
  if (fd < 0 || ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                         reinterpret_cast<const sockaddr*>(&addr), size) < 0)
    spdlog::warn("NOTIFY_SOCKET={}: {}", where, std::strerror(errno));
  if (fd >= 0) ::close(fd);
}

// Under systemd, stderr goes to the journal ($JOURNAL_STREAM): each line then carries its
// syslog priority as sd-daemon(3)'s "<N>" prefix and no time stamp of its own (the journal
// keeps one), so that `journalctl -p warning -u solar-stored@NAME` selects by level.
class SyslogPriority final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& m, const std::tm&, spdlog::memory_buf_t& out) override {
    static constexpr std::string_view kPrefix[] = {"<7>", "<7>", "<6>", "<4>", "<3>", "<2>", ""};
    const auto p = kPrefix[std::min<std::size_t>(static_cast<std::size_t>(m.level), 6)];
    out.append(p.data(), p.data() + p.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return spdlog::details::make_unique<SyslogPriority>();
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "solar-stored: export HDF5 datasets read-only to solar clients over libfabric RMA.\n"
      "Clients read fabric://HOST:PORT/NAME; contiguous datasets are read with one-sided RDMA\n"
      "from the mapped file (or the server's own copy, --in-memory), chunked/compressed ones\n"
      "through a registered staging buffer.",
      "solar-stored"};
  app.set_version_flag("--version", "solar-stored " SOLAR_PROJECT_VERSION);
  app.set_config("--config", "",
                 "Read options from this file (TOML or INI: one `name = value` a line, the long "
                 "option's name without its dashes, e.g. listen = \"0.0.0.0:7070\", export = "
                 "[\"cosmo=/data/cosmo.h5:/data\"], token-file = \"/etc/solar/stored.token\"); "
                 "the command line overrides it. packaging/systemd/ has a unit and an example");
  app.allow_config_extras(false);  // a misspelt name in the file is an error, not ignored
  solar::storage::ServerOptions o;
  std::string listen = "127.0.0.1:0";
  std::vector<std::string> exports;
  std::string bandwidth;
  double latency_ms = 0;
  std::string staging = "64M";
  app.add_option("--listen", listen,
                 "HOST:PORT for the TCP bootstrap (port 0: any free port, see --ready-file); the "
                 "fabric endpoint binds to the same host [127.0.0.1:0]");
  app.add_option("--export", exports,
                 "NAME=FILE.h5:/dataset to export (repeatable; /dataset defaults to /data; "
                 "labels come from --labels in the same file when present), or a dataset of "
                 "many files as one export: NAME=DIR:/name, NAME='GLOB:/name', NAME=@LIST:/name "
                 "(each file's array one sample; /name[] for its rows)")
      ->required();
  app.add_option("--labels", o.labels,
                 "The labels array in every exported file ('' for none) [/label]");
  app.add_option("--provider", o.provider,
                 "libfabric provider, e.g. tcp;ofi_rxm (default), shm (same host only), verbs;"
                 "ofi_rxm. Without it $FI_PROVIDER is honoured");
  auto* token_opt =
      app.add_option("--token", o.token,
                     "Shared token clients must present (they set SOLAR_STORED_TOKEN); without "
                     "a token anyone who reaches the port may read the exports. On the command "
                     "line every user of the host sees it until the server has started: prefer "
                     "--token-file, or SOLAR_STORED_TOKEN in the server's environment");
  std::string token_file;
  app.add_option("--token-file", token_file,
                 "Read the token from this file's first line: a regular file of this user, "
                 "readable by nobody else (mode 0600 or 0400); shown in no process listing")
      ->type_name("FILE")
      ->excludes(token_opt);
  app.add_option("--throttle-bandwidth", bandwidth,
                 "EMULATION for single-machine benchmarks: cap each client's read bandwidth, "
                 "bytes/s with K/M/G suffix (e.g. 500M). Enforced by the client library; not a "
                 "security or QoS control")
      ->type_name("SIZE");
  app.add_option("--throttle-latency", latency_ms,
                 "EMULATION: add this many milliseconds to every read request, as a contended "
                 "parallel file system would")
      ->type_name("FLOAT");
  app.add_option("--staging-bytes", staging,
                 "Size of each registered staging buffer for chunked/compressed datasets (at "
                 "least one sample) [64M]")
      ->type_name("SIZE");
  app.add_option("--max-pending", o.max_pending,
                 "Connections that may wait for their hello (before the token check) at once; "
                 "each holds at most a 16 KiB buffer and no thread; more are refused as busy "
                 "(clients retry) [256]")
      ->type_name("UINT")
      ->check(CLI::Range(1u, 1000000u).description(""));
  app.add_option("--max-clients", o.max_clients,
                 "Authenticated connections served at once, one thread each (a job's agents, "
                 "and its ranks when they read directly); more are refused as busy [1024]")
      ->type_name("UINT")
      ->check(CLI::Range(1u, 1000000u).description(""));
  app.add_option("--hello-timeout", o.hello_timeout_s,
                 "Seconds a new connection has to say hello before it is closed [10]")
      ->type_name("SECONDS")
      ->check(CLI::Range(0.001, 3600.0).description(""));
  app.add_option("--ready-file", o.ready_file,
                 "Write HOST:PORT to this file once the server accepts connections");
  app.add_flag("--busy-poll", o.busy_poll,
               "Drive the fabric by polling its completion queue without pause while a client "
               "is connected (one core busy) instead of sleeping on its wait object until a "
               "read arrives");
  app.add_flag("--in-memory", o.in_memory,
               "Read each contiguous export into the server's own memory at start (O_DIRECT where "
               "the file system allows it, huge pages where the kernel gives them) and serve it "
               "from there: clients copy anonymous memory faster than the file's page cache. "
               "Needs the exports' size in available memory (an export that does not fit is "
               "refused, naming the sizes); a file changed afterwards is still withdrawn. "
               "Chunked/compressed exports stay staged");
  bool quiet = false;
  app.add_flag("--quiet", quiet, "Log warnings and errors only");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    const bool in_config = dynamic_cast<const CLI::ConfigError*>(&e) != nullptr ||
                           dynamic_cast<const CLI::FileError*>(&e) != nullptr;
    std::fprintf(stderr, "solar-stored: %s%s\nRun `solar-stored --help`.\n",
                 in_config ? "--config: " : "", e.what());
    return 2;
  }
  if (const char* j = std::getenv("JOURNAL_STREAM"); j && *j) {
    auto f = std::make_unique<spdlog::pattern_formatter>();
    f->add_flag<SyslogPriority>('*').set_pattern("%*%v");
    spdlog::set_formatter(std::move(f));
  } else {
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] solar-stored %l: %v");
  }
  if (quiet) spdlog::set_level(spdlog::level::warn);
  if (scrub_token_argument(argc, argv))
    spdlog::warn("--token on the command line was visible to every user of this host until now "
                 "(ps); use --token-file FILE (mode 0600) or SOLAR_STORED_TOKEN instead");
  try {
    if (!token_file.empty()) {
      o.token = read_token_file(token_file);
      spdlog::info("clients must present the token in {}", token_file);
    } else if (o.token.empty()) {
      if (const char* t = std::getenv("SOLAR_STORED_TOKEN"); t && *t) {
        o.token = t;
        spdlog::info("clients must present the token in SOLAR_STORED_TOKEN");
      }
    }
    const auto colon = listen.rfind(':');
    if (colon == std::string::npos) throw solar::ConfigError("--listen", "expected HOST:PORT");
    o.host = listen.substr(0, colon);
    const std::string port = listen.substr(colon + 1);
    if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoul(port) > 65535)
      throw solar::ConfigError("--listen", "port must be a number in 0..65535");
    o.port = static_cast<std::uint16_t>(std::stoul(port));
    for (const auto& e : exports) o.exports.push_back(solar::storage::Export::parse(e));
    if (!bandwidth.empty()) o.throttle_bandwidth = solar::parse_bytes(bandwidth, "--throttle-bandwidth");
    if (latency_ms < 0) throw solar::ConfigError("--throttle-latency", "must be ≥ 0 ms");
    o.throttle_latency_s = latency_ms / 1000;
    o.staging_bytes = solar::parse_bytes(staging, "--staging-bytes");
    if (o.staging_bytes == 0) throw solar::ConfigError("--staging-bytes", "must be > 0");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solar-stored: %s\n", e.what());
    return 2;
  }
  const std::size_t n_exports = o.exports.size();
  o.on_ready = [n_exports](const std::string& host, std::uint16_t port) {
    notify_systemd(fmt::format("READY=1\nSTATUS=serving {} export{} on {}:{}\nMAINPID={}",
                               n_exports, n_exports == 1 ? "" : "s", host, port, ::getpid()));
  };
  try {
    solar::storage::StorageServer server(o);
    server.run();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    notify_systemd(fmt::format("STATUS=failed: {}", e.what()));
    return 1;
  }
  notify_systemd("STOPPING=1");
  return 0;
}

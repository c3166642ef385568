// solar-stored: exports HDF5 datasets read-only over libfabric RMA (see storage/README.md).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdio>

#include "solar/core/config.h"
#include "solar/storage/server.h"

int main(int argc, char** argv) {
  CLI::App app{
      "solar-stored: export HDF5 datasets read-only to solar clients over libfabric RMA.\n"
      "Clients read fabric://HOST:PORT/NAME; contiguous datasets are read with one-sided RDMA\n"
      "from the mapped file (or the server's own copy, --in-memory), chunked/compressed ones\n"
      "through a registered staging buffer.",
      "solar-stored"};
  app.set_version_flag("--version", "solar-stored " SOLAR_PROJECT_VERSION);
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
  app.add_option("--token", o.token,
                 "Shared token clients must present (they set SOLAR_STORED_TOKEN); without it "
                 "anyone who reaches the port may read the exports");
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
    std::fprintf(stderr, "solar-stored: %s\nRun `solar-stored --help`.\n", e.what());
    return 2;
  }
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] solar-stored %l: %v");
  if (quiet) spdlog::set_level(spdlog::level::warn);
  try {
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
  try {
    solar::storage::StorageServer server(o);
    server.run();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
}

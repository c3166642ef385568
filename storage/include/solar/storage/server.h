// SPDX-License-Identifier: Apache-2.0
// StorageServer: the body of `solar-stored`. Exports named HDF5 datasets read-only over
// libfabric. Contiguous datasets are memory-mapped and registered for remote read exactly over
// their data region, so clients read them with one-sided RMA and no server CPU on the data
// path; chunked or compressed ones are read by the server into a registered per-connection
// staging buffer on request. A dedicated thread busy-polls the completion queue (providers
// make no progress on the target side otherwise). Clients bootstrap over TCP (Boost.Asio):
// their hellos are read on the accepting thread with bounded buffers (ServerOptions limits),
// and only an accepted client gets a thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace solar::storage {

struct Export {
  std::string name;     // what clients ask for: fabric://host:port/NAME
  std::string path;     // FILE.h5
  std::string dataset;  // /data
  std::string spec;     // FILE.h5:/dataset as given, or many files: DIR:/name, 'GLOB:/name',
                        // @LIST:/name (dataset_files.h)
  // Parses NAME=FILE.h5:/dataset (dataset defaults to /data) or NAME=DIR:/name (a dataset of
  // many files, one export). Throws StorageError.
  static Export parse(const std::string& spec);
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;  // 0: any free port (see ready_file)
  std::vector<Export> exports;
  std::string provider;    // "" = $FI_PROVIDER, else tcp;ofi_rxm
  std::string token;       // "" = anyone may connect
  std::uint64_t throttle_bandwidth = 0;  // emulation, bytes/s per client; 0 = off
  double throttle_latency_s = 0;         // emulation, added to every request
  std::uint64_t staging_bytes = 64ULL << 20;
  std::string ready_file;  // written (HOST:PORT) once the server accepts connections
  // Called then too, with the address (solar-stored tells systemd it is ready).
  std::function<void(const std::string& host, std::uint16_t port)> on_ready;
  // Bounds on what strangers can make the server hold before their token is checked: at most
  // max_pending connections wait for their hello (each with a buffer of at most
  // wire::kMaxHello = 16 KiB, read on the accepting thread: no thread of their own), each for
  // hello_timeout_s at most; more are refused ("server busy", retry) and closed. Authenticated
  // connections get a thread each, max_clients at most.
  unsigned max_pending = 256;
  unsigned max_clients = 1024;
  double hello_timeout_s = 10;
  // Target-side progress (reads do not complete unless the server drives the provider): by
  // default the progress thread sleeps in fi_cq_sread on the completion queue's wait object,
  // woken by the provider when a read arrives (tcp;ofi_rxm: the sockets), so an idle server
  // takes no CPU and a busy one does not spin against its clients for the cores; providers
  // without a wait object are polled. busy_poll: poll always (sched_yield between polls).
  bool busy_poll = false;
  // Contiguous exports are read at start into the server's own memory and served from there
  // (a storage server's DRAM tier) instead of from the mapped file's page cache. An export
  // that does not fit in available memory is refused by name; staged exports are unaffected.
  bool in_memory = false;
  std::string labels = "/label";  // the labels array in every export's file(s) ("" = none)
};

class StorageServer {
 public:
  // Opens every export and the fabric endpoint. Throws StorageError naming the bad export.
  explicit StorageServer(ServerOptions options);
  ~StorageServer();
  // Serves until SIGINT/SIGTERM or stop(). Returns the port it listened on.
  void run();
  void stop();
  std::uint16_t port() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace solar::storage

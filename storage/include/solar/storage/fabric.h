// SPDX-License-Identifier: Apache-2.0
// One libfabric RDM endpoint with its fabric, domain, address vector and completion queue, and
// the memory registrations made on it. Honours the provider's mr_mode: FI_MR_VIRT_ADDR (remote
// addresses are virtual addresses), FI_MR_PROV_KEY, FI_MR_ENDPOINT and FI_MR_LOCAL.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace solar::storage::fabric {

std::string error_text(long rc);  // fi_strerror of a negative return code

// A registered buffer. Remote peers address it as (key, base + offset).
class Region {
 public:
  Region() = default;
  Region(fid_mr* mr, std::uint64_t key, std::uint64_t base, void* desc)
      : mr_(mr), key_(key), base_(base), desc_(desc) {}
  Region(Region&& o) noexcept { *this = std::move(o); }
  Region& operator=(Region&& o) noexcept;
  ~Region();
  std::uint64_t key() const { return key_; }
  std::uint64_t base() const { return base_; }  // remote address of byte 0
  void* desc() const { return desc_; }

 private:
  fid_mr* mr_ = nullptr;
  std::uint64_t key_ = 0, base_ = 0;
  void* desc_ = nullptr;
};

class Endpoint {
 public:
  // provider: a libfabric provider name ("tcp;ofi_rxm", "shm", ...) or "" for FI_PROVIDER / the
  // library's choice. node: address to bind to (servers), "" for any.
  // wait: give the completion queue a wait object (fi_cq_sread blocks in the kernel until the
  // provider has work), where the provider offers one; waitable() says whether it did.
  // remote_write: also FI_WRITE | FI_REMOTE_WRITE (the agents' peer progress counters).
  static std::unique_ptr<Endpoint> open(const std::string& provider, const std::string& node,
                                        bool wait = false, bool remote_write = false);
  bool waitable() const { return waitable_; }
  ~Endpoint();

  std::string provider() const;
  bool virt_addr() const;   // FI_MR_VIRT_ADDR: remote addresses are virtual addresses
  bool local_mr() const;    // FI_MR_LOCAL: local buffers of reads must be registered
  std::uint64_t max_msg_size() const;
  std::vector<std::uint8_t> address() const;
  fi_addr_t insert(const std::vector<std::uint8_t>& address);

  // access: FI_REMOTE_READ for exported memory, FI_READ for local destinations.
  // The key is unguessable: 64 random bits from getrandom(2) (fewer when the provider's keys
  // are shorter), or the provider's own key where it chooses them (FI_MR_PROV_KEY: verbs,
  // cxi). Registrations may be made from several threads.
  Region register_memory(const void* buf, std::size_t len, std::uint64_t access);

  fid_ep* ep() const { return ep_; }
  fid_cq* cq() const { return cq_; }

 private:
  Endpoint() = default;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_ep* ep_ = nullptr;
  std::mutex reg_mu_;
  bool waitable_ = false;
};

}  // namespace solar::storage::fabric

// SPDX-License-Identifier: Apache-2.0
#include "solar/storage/fabric.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <sys/random.h>

#include <algorithm>
#include <string_view>
#include <type_traits>

#include "solar/storage/signals.h"
#include "solar/storage/sample_source.h"

namespace solar::storage::fabric {

namespace {

// libfabric, opened on first use (dlopen) instead of linked: loading it loads the libraries of
// every built-in provider (psm, efa, verbs, ...) and runs their constructors, 0.2 s here, which
// a process that reads only files (solar, solar-agent, a rank's libsolar-direct.so) must not
// pay at start. libinfinipath's constructor installs signal handlers that exit(1): whatever the
// load changes is put back (signals.h). These five are the only libfabric functions called by
// name; everything else is an inline call through the objects they return.
struct Libfabric {
  decltype(&::fi_getinfo) getinfo = nullptr;
  decltype(&::fi_freeinfo) freeinfo = nullptr;
  decltype(&::fi_dupinfo) dupinfo = nullptr;
  decltype(&::fi_fabric) fabric = nullptr;
  decltype(&::fi_strerror) strerror = nullptr;
  std::string missing;  // why it could not be loaded ("" = loaded)

  Libfabric() {
    void* h = nullptr;
    {
      const signals::Snapshot before;
      h = ::dlopen(kLibrary, RTLD_NOW | RTLD_GLOBAL);
      before.restore();
    }
    if (!h) {
      const char* why = ::dlerror();
      missing = fmt::format("libfabric ({}) could not be loaded: {}; fabric:// sources and "
                            "solar-stored need it (Debian: apt install libfabric1)",
                            kLibrary, why ? why : "unknown error");
      return;
    }
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name));
      if (!fn && missing.empty()) missing = fmt::format("{} has no {}", kLibrary, name);
    };
    get(getinfo, "fi_getinfo");
    get(freeinfo, "fi_freeinfo");
    get(dupinfo, "fi_dupinfo");
    get(fabric, "fi_fabric");
    get(strerror, "fi_strerror");
  }
  static constexpr const char* kLibrary = "libfabric.so.1";
};

const Libfabric& libfabric() {
  static const Libfabric lib;  // loaded once, never unloaded
  if (!lib.missing.empty()) throw StorageError(lib.missing);
  return lib;
}

}  // namespace

std::string error_text(long rc) {
  return libfabric().strerror(static_cast<int>(rc < 0 ? -rc : rc));
}

Region& Region::operator=(Region&& o) noexcept {
  if (this != &o) {
    if (mr_) fi_close(&mr_->fid);
    mr_ = o.mr_;
    key_ = o.key_;
    base_ = o.base_;
    desc_ = o.desc_;
    o.mr_ = nullptr;
  }
  return *this;
}

Region::~Region() {
  if (mr_) fi_close(&mr_->fid);
}

namespace {
fi_info* hints_for(const std::string& provider, bool thread_safe, bool remote_write) {
  fi_info* h = libfabric().dupinfo(nullptr);  // fi_allocinfo()
  h->ep_attr->type = FI_EP_RDM;
  h->caps = FI_RMA | FI_READ | FI_REMOTE_READ;
  if (remote_write) h->caps |= FI_WRITE | FI_REMOTE_WRITE;
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  if (thread_safe) h->domain_attr->threading = FI_THREAD_SAFE;
  if (!provider.empty()) h->fabric_attr->prov_name = strdup(provider.c_str());
  return h;
}
}  // namespace

std::unique_ptr<Endpoint> Endpoint::open(const std::string& provider, const std::string& node,
                                         bool wait, bool remote_write) {
  // Initialising the providers (psm's among them) must not leave handlers of theirs behind in
  // the caller's process (signals.h): whatever changes here is put back as it was.
  struct KeepSignals {
    signals::Snapshot before;
    ~KeepSignals() { before.restore(); }
  } keep_signals;
  std::unique_ptr<Endpoint> e(new Endpoint());
  const bool bind = !node.empty() && provider != "shm";
  int rc = -FI_ENODATA;
  for (bool thread_safe : {true, false}) {
    fi_info* hints = hints_for(provider, thread_safe, remote_write);
    rc = libfabric().getinfo(FI_VERSION(1, 9), bind ? node.c_str() : nullptr, nullptr,
                    bind ? FI_SOURCE : 0, hints, &e->info_);
    libfabric().freeinfo(hints);
    if (rc == 0) break;
  }
  const std::string prov = provider.empty() ? "(default)" : provider;
  if (rc != 0)
    throw StorageError(fmt::format(
        "libfabric: no provider '{}' with RDM endpoints and RMA reads{}: {}; `fi_info -l` lists "
        "the providers here (try tcp;ofi_rxm or shm)",
        prov, bind ? " on " + node : "", error_text(rc)));
  auto fail = [&](const char* what, long r) {
    return StorageError(fmt::format("libfabric {} ({}): {}", what,
                                    e->info_->fabric_attr->prov_name, error_text(r)));
  };
  if (long r = libfabric().fabric(e->info_->fabric_attr, &e->fabric_, nullptr)) throw fail("fi_fabric", r);
  if (long r = fi_domain(e->fabric_, e->info_, &e->domain_, nullptr)) throw fail("fi_domain", r);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  if (long r = fi_av_open(e->domain_, &av_attr, &e->av_, nullptr)) throw fail("fi_av_open", r);
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_CONTEXT;
  // Only a wait object with a descriptor (FI_WAIT_FD) helps: the provider's sockets wake it.
  // shm has no descriptor to wake anyone, and its FI_WAIT_UNSPEC wait is a sched_yield loop
  // that did not even return at its timeout (libfabric 1.17): shm is polled.
  wait = wait && std::string_view(e->info_->fabric_attr->prov_name).substr(0, 3) != "shm";
  cq_attr.wait_obj = wait ? FI_WAIT_FD : FI_WAIT_NONE;
  cq_attr.size = 1024;
  long cq_rc = fi_cq_open(e->domain_, &cq_attr, &e->cq_, nullptr);
  if (cq_rc && wait) {  // no wait object here: poll
    cq_attr.wait_obj = FI_WAIT_NONE;
    cq_rc = fi_cq_open(e->domain_, &cq_attr, &e->cq_, nullptr);
  } else if (!cq_rc) {
    e->waitable_ = wait;
  }
  if (cq_rc) throw fail("fi_cq_open", cq_rc);
  if (long r = fi_endpoint(e->domain_, e->info_, &e->ep_, nullptr)) throw fail("fi_endpoint", r);
  if (long r = fi_ep_bind(e->ep_, &e->av_->fid, 0)) throw fail("fi_ep_bind(av)", r);
  if (long r = fi_ep_bind(e->ep_, &e->cq_->fid, FI_TRANSMIT | FI_RECV))
    throw fail("fi_ep_bind(cq)", r);
  if (long r = fi_enable(e->ep_)) throw fail("fi_enable", r);
  return e;
}

Endpoint::~Endpoint() {
  if (ep_) fi_close(&ep_->fid);
  if (av_) fi_close(&av_->fid);
  if (cq_) fi_close(&cq_->fid);
  if (domain_) fi_close(&domain_->fid);
  if (fabric_) fi_close(&fabric_->fid);
  if (info_) libfabric().freeinfo(info_);
}

std::string Endpoint::provider() const { return info_->fabric_attr->prov_name; }
bool Endpoint::virt_addr() const { return info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR; }
bool Endpoint::local_mr() const { return info_->domain_attr->mr_mode & FI_MR_LOCAL; }
std::uint64_t Endpoint::max_msg_size() const { return info_->ep_attr->max_msg_size; }

std::vector<std::uint8_t> Endpoint::address() const {
  std::size_t len = 0;
  fi_getname(&ep_->fid, nullptr, &len);
  std::vector<std::uint8_t> addr(len);
  if (long r = fi_getname(&ep_->fid, addr.data(), &len))
    throw StorageError(fmt::format("libfabric fi_getname: {}", error_text(r)));
  addr.resize(len);
  return addr;
}

fi_addr_t Endpoint::insert(const std::vector<std::uint8_t>& address) {
  fi_addr_t a = FI_ADDR_UNSPEC;
  const int n = fi_av_insert(av_, address.data(), 1, &a, 0, nullptr);
  if (n != 1)
    throw StorageError(fmt::format("libfabric fi_av_insert of the server's address failed ({})",
                                   n < 0 ? error_text(n) : "not inserted"));
  return a;
}

Region Endpoint::register_memory(const void* buf, std::size_t len, std::uint64_t access) {
  fid_mr* mr = nullptr;
  const std::size_t key_bytes = std::min<std::size_t>(8, info_->domain_attr->mr_key_size);
  std::lock_guard g(reg_mu_);
  long r = -FI_ENOKEY;
  for (int attempt = 0; attempt < 16 && r == -FI_ENOKEY; ++attempt) {  // ENOKEY: key in use
    std::uint64_t requested = 0;
    if (::getrandom(&requested, key_bytes, 0) != static_cast<ssize_t>(key_bytes))
      throw StorageError(fmt::format("getrandom for a memory key: {}", std::strerror(errno)));
    r = fi_mr_reg(domain_, buf, len, access, 0, requested, 0, &mr, nullptr);
  }
  if (r)
    throw StorageError(fmt::format("libfabric fi_mr_reg of {} bytes: {}", len, error_text(r)));
  if (info_->domain_attr->mr_mode & FI_MR_ENDPOINT) {
    r = fi_mr_bind(mr, &ep_->fid, 0);
    if (!r) r = fi_mr_enable(mr);
    if (r) {
      fi_close(&mr->fid);
      throw StorageError(fmt::format("libfabric fi_mr_bind: {}", error_text(r)));
    }
  }
  const std::uint64_t base = virt_addr() ? reinterpret_cast<std::uint64_t>(buf) : 0;
  return Region(mr, fi_mr_key(mr), base, fi_mr_desc(mr));
}

}  // namespace solar::storage::fabric

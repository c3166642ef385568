// SPDX-License-Identifier: Apache-2.0
// solar_peer_probe CARD: what another process can do to an agent's buffer over the fabric,
// given the agent's peer card (tests/agent/test_peers.py). Every attempt uses a fresh endpoint
// (a failed RMA operation breaks the endpoint's connection). Prints one line per attempt:
//   granted-read ok|refused       the card's key reads the index (control: the key works)
//   guessed-read KEY ok|refused   keys someone without the card might try
//   guessed-write KEY ok|refused  writes with guessed keys
//   granted-write ok|refused      a write with the card's key (the buffer is registered for
//                                 remote reads only)
// A write counts as ok only when its bytes landed (read back with the card's key): the
// initiator's completion of a write over tcp;ofi_rxm says "sent", not "accepted".
// Exit status 0 when every attempt came out as it must (granted read ok, the rest refused).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "solar/storage/fabric.h"

namespace fabric = solar::storage::fabric;

namespace {

std::vector<std::uint8_t> from_hex(const std::string& s) {
  std::vector<std::uint8_t> b(s.size() / 2);
  for (std::size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<std::uint8_t>(std::stoul(s.substr(2 * i, 2), nullptr, 16));
  return b;
}

// One RMA operation from a fresh endpoint: whether it completed without error within 10 s.
// A read's bytes are returned in *got.
bool attempt(const nlohmann::json& card, std::uint64_t key, std::uint64_t addr, bool write,
             std::uint64_t* got = nullptr) {
  auto ep = fabric::Endpoint::open(card.at("provider").get<std::string>(), "", false, true);
  const fi_addr_t peer = ep->insert(from_hex(card.at("address").get<std::string>()));
  std::vector<std::uint64_t> buf(8, 0x5555555555555555ULL);
  fabric::Region local;
  if (ep->local_mr())
    local = ep->register_memory(buf.data(), buf.size() * 8, write ? FI_WRITE : FI_READ);
  fi_context2 ctx{};
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  ssize_t rc;
  for (;;) {
    rc = write ? fi_write(ep->ep(), buf.data(), 8, local.desc(), peer, addr, key, &ctx)
               : fi_read(ep->ep(), buf.data(), 8, local.desc(), peer, addr, key, &ctx);
    if (rc != -FI_EAGAIN || std::chrono::steady_clock::now() > until) break;
    fi_cq_entry e[1];
    fi_cq_read(ep->cq(), e, 1);
  }
  if (rc != 0) return false;
  while (std::chrono::steady_clock::now() < until) {
    fi_cq_entry e[1];
    const ssize_t n = fi_cq_read(ep->cq(), e, 1);
    if (n == 1) {
      if (got) *got = buf[0];
      return true;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(ep->cq(), &err, 0);
      return false;
    }
  }
  return false;  // neither completed nor failed: not a read that worked
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: solar_peer_probe CARD\n");
    return 2;
  }
  std::ifstream f(argv[1]);
  if (!f) {
    std::perror(argv[1]);
    return 2;
  }
  const nlohmann::json card = nlohmann::json::parse(f);
  const std::uint64_t key = card.at("buf_key"), base = card.at("buf_base");
  const std::uint64_t at = base + card.at("entries_offset").get<std::uint64_t>();
  bool as_it_must = true;
  const bool granted = attempt(card, key, at, false);
  std::printf("granted-read %s\n", granted ? "ok" : "refused");
  as_it_must &= granted;
  std::vector<std::uint64_t> guesses;
  for (std::uint64_t k = 0; k <= 8; ++k) guesses.push_back(k);
  for (std::uint64_t k : std::initializer_list<std::uint64_t>{0xffffffffULL, 1ULL << 63, ~0ULL,
                                                               key ^ 1, key ^ 2, key + 1})
    guesses.push_back(k);
  for (std::uint64_t k : guesses) {
    if (k == key) continue;
    const bool ok = attempt(card, k, at, false);
    std::printf("guessed-read %llu %s\n", static_cast<unsigned long long>(k),
                ok ? "ok" : "refused");
    as_it_must &= !ok;
  }
  // Writes: whether the bytes landed, read back with the card's key (an initiator's write
  // completion may only mean "sent"). The word just before the index entries is unused in
  // batch mode (the index header's tail).
  const std::uint64_t word = at - 8;
  auto landed = [&](std::uint64_t k) {
    std::uint64_t before = 1, after = 1;
    attempt(card, key, word, false, &before);
    attempt(card, k, word, true);
    attempt(card, key, word, false, &after);
    return after != before && after == 0x5555555555555555ULL;
  };
  for (std::uint64_t k : std::initializer_list<std::uint64_t>{0, 1, key ^ 1}) {
    const bool ok = landed(k);
    std::printf("guessed-write %llu %s\n", static_cast<unsigned long long>(k),
                ok ? "ok" : "refused");
    as_it_must &= !ok;
  }
  const bool wrote = landed(key);
  std::printf("granted-write %s\n", wrote ? "ok" : "refused");
  as_it_must &= !wrote;
  return as_it_must ? 0 : 1;
}

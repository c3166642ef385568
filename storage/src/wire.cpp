#include "wire.h"

#include <fmt/format.h>

namespace solar::storage::wire {
namespace asio = boost::asio;

void send(asio::ip::tcp::socket& s, const nlohmann::json& msg) {
  const std::string body = msg.dump();
  const std::uint32_t n = static_cast<std::uint32_t>(body.size());
  unsigned char len[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                          static_cast<unsigned char>(n >> 16),
                          static_cast<unsigned char>(n >> 24)};
  std::array<asio::const_buffer, 2> bufs{asio::buffer(len, 4), asio::buffer(body)};
  asio::write(s, bufs);
}

nlohmann::json receive(asio::ip::tcp::socket& s) {
  unsigned char len[4];
  asio::read(s, asio::buffer(len, 4));
  const std::uint32_t n = len[0] | (len[1] << 8) | (len[2] << 16) | (std::uint32_t{len[3]} << 24);
  if (n > kMaxMessage)
    throw StorageError(fmt::format("protocol error: a {}-byte message (limit {}); is the peer a "
                                   "solar-stored / solar client?",
                                   n, kMaxMessage));
  std::string body(n, '\0');
  asio::read(s, asio::buffer(body));
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw StorageError("protocol error: a message that is not a JSON object");
  return j;
}

std::string to_hex(const std::vector<std::uint8_t>& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (auto b : bytes) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

std::vector<std::uint8_t> from_hex(const std::string& hex) {
  auto val = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (hex.size() % 2) throw StorageError("protocol error: bad fabric address");
  std::vector<std::uint8_t> out(hex.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = val(hex[2 * i]), lo = val(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) throw StorageError("protocol error: bad fabric address");
    out[i] = static_cast<std::uint8_t>(hi * 16 + lo);
  }
  return out;
}

nlohmann::json to_json(const DatasetInfo& i) {
  nlohmann::json j = {{"samples", i.samples},
                      {"shape", i.sample_shape},
                      {"dtype", std::string(to_string(i.dtype))},
                      {"sample_bytes", i.sample_bytes},
                      {"has_labels", i.has_labels},
                      {"label_dtype", std::string(to_string(i.label_dtype))},
                      {"label_bytes", i.label_bytes},
                      {"layout", i.layout}};
  if (i.seed) j["seed"] = *i.seed;
  return j;
}

DatasetInfo info_from_json(const nlohmann::json& j) {
  DatasetInfo i;
  try {
    i.samples = j.at("samples").get<std::uint64_t>();
    i.sample_shape = j.at("shape").get<std::vector<std::uint64_t>>();
    auto dt = parse_dtype(j.at("dtype").get<std::string>());
    auto lt = parse_dtype(j.at("label_dtype").get<std::string>());
    if (!dt || !lt) throw StorageError("protocol error: unknown dtype");
    i.dtype = *dt;
    i.label_dtype = *lt;
    i.sample_bytes = j.at("sample_bytes").get<std::uint64_t>();
    i.has_labels = j.at("has_labels").get<bool>();
    i.label_bytes = j.at("label_bytes").get<std::uint64_t>();
    i.layout = j.at("layout").get<std::string>();
    if (j.contains("seed")) i.seed = j["seed"].get<std::uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw StorageError(fmt::format("protocol error: bad dataset description ({})", e.what()));
  }
  return i;
}

}  // namespace solar::storage::wire

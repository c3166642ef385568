// SPDX-License-Identifier: Apache-2.0
#include "wire.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cmath>

namespace solar::storage::wire {
namespace asio = boost::asio;

namespace {

[[noreturn]] void fail(int err) {
  if (err == EAGAIN || err == EWOULDBLOCK) err = ETIMEDOUT;  // SO_RCVTIMEO / SO_SNDTIMEO expired
  throw boost::system::system_error(boost::system::error_code(err, boost::system::system_category()));
}

void send_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(errno);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void recv_all(int fd, char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r == 0) throw boost::system::system_error(asio::error::eof);
    if (r < 0) {
      if (errno == EINTR) continue;
      fail(errno);
    }
    p += r;
    n -= static_cast<std::size_t>(r);
  }
}

}  // namespace

std::uint32_t frame_length(const unsigned char len[4]) {
  return len[0] | (len[1] << 8) | (len[2] << 16) | (std::uint32_t{len[3]} << 24);
}

std::string frame(const nlohmann::json& msg) {
  const std::string body = msg.dump();
  const std::uint32_t n = static_cast<std::uint32_t>(body.size());
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + body;
}

nlohmann::json parse_body(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw StorageError("protocol error: a message that is not a JSON object");
  return j;
}

void send(asio::ip::tcp::socket& s, const nlohmann::json& msg) {
  const std::string f = frame(msg);
  send_all(s.native_handle(), f.data(), f.size());
}

nlohmann::json receive(asio::ip::tcp::socket& s, std::uint32_t limit) {
  const int fd = s.native_handle();
  unsigned char len[4];
  recv_all(fd, reinterpret_cast<char*>(len), 4);
  const std::uint32_t n = frame_length(len);
  if (n > limit)
    throw StorageError(fmt::format("protocol error: a {}-byte message (limit {}); is the peer a "
                                   "solar-stored / solar client?",
                                   n, limit));
  // Grown as the bytes come: a peer that announces a large message and sends nothing holds
  // 64 KiB at most.
  std::string body;
  constexpr std::size_t kStep = 64 << 10;
  while (body.size() < n) {
    const std::size_t have = body.size(), take = std::min<std::size_t>(kStep, n - have);
    body.resize(have + take);
    recv_all(fd, body.data() + have, take);
  }
  return parse_body(body);
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

namespace {
// A non-negative JSON integer. (get<std::uint64_t> converts any number, and -1.5 or 1e300 that
// way is undefined behaviour: fuzz.stored_wire.)
bool is_count(const nlohmann::json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0);
}

// A string field, "" when absent.
std::string text_field(const nlohmann::json& msg, const char* key, const char* what) {
  const auto it = msg.find(key);
  if (it == msg.end()) return {};
  if (!it->is_string())
    throw StorageError(fmt::format("protocol error: the {}'s \"{}\" is not a string", what, key));
  return it->get<std::string>();
}
}  // namespace

std::uint64_t count_field(const nlohmann::json& v, std::string_view what) {
  if (!is_count(v))
    throw StorageError(fmt::format("protocol error: {} ({} is not a count)", what, v.dump()));
  return v.get<std::uint64_t>();
}

double rate_field(const nlohmann::json& v, std::string_view what) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
    throw StorageError(
        fmt::format("protocol error: {} ({} is not a finite number >= 0)", what, v.dump()));
  return v.get<double>();
}

Hello parse_hello(const nlohmann::json& msg) {
  Hello h;
  h.op = text_field(msg, "op", "hello");
  h.token = text_field(msg, "token", "hello");
  h.dataset = text_field(msg, "dataset", "hello");
  if (const auto it = msg.find("version"); it != msg.end()) {
    if (!it->is_number_integer())
      throw StorageError("protocol error: the hello's \"version\" is not an integer");
    h.version = it->get<std::int64_t>();
  }
  return h;
}

Request parse_request(const nlohmann::json& msg) {
  Request r;
  r.op = text_field(msg, "op", "request");
  if (r.op == "reference") {
    const auto it = msg.find("bytes");
    if (it == msg.end() || !is_count(*it))
      throw StorageError("protocol error: bad bytes in reference request");
    r.bytes = it->get<std::uint64_t>();
    return r;
  }
  if (r.op != "stage") return r;
  const auto it = msg.find("runs");
  if (it == msg.end() || !it->is_array())
    throw StorageError("protocol error: bad runs in stage request");
  for (const auto& run : *it) {
    if (!run.is_array() || run.size() != 2 || !is_count(run[0]) || !is_count(run[1]))
      throw StorageError("protocol error: bad runs in stage request");
    r.runs.push_back({run[0].get<std::uint64_t>(), run[1].get<std::uint64_t>()});
  }
  return r;
}

std::uint64_t staged_bytes(const DatasetInfo& info, std::span<const SampleRun> runs,
                           std::uint64_t limit, const std::string& source) {
  check_runs(info, runs, source);
  // Counted against the limit run by run: a request repeating runs could otherwise wrap the
  // total bytes around 64 bits, pass the check and overrun the buffer (fuzz.stored_wire).
  const std::uint64_t most = info.sample_bytes ? limit / info.sample_bytes : ~std::uint64_t{0};
  std::uint64_t samples = 0;
  for (const SampleRun& r : runs) {
    if (r.count > most - samples)
      throw StorageError(fmt::format("stage request of more than {} samples of {} bytes refused "
                                     "(staging buffer {} bytes; contiguous exports are read "
                                     "directly)",
                                     most, info.sample_bytes, limit));
    samples += r.count;
  }
  return samples * info.sample_bytes;
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
  if (i.seed && i.content == Content::sparse) j["content"] = "sparse";
  return j;
}

DatasetInfo info_from_json(const nlohmann::json& j) {
  static constexpr std::string_view kInfo = "bad dataset description";
  DatasetInfo i;
  try {
    i.samples = count_field(j.at("samples"), kInfo);
    const nlohmann::json& shape = j.at("shape");
    if (!shape.is_array())
      throw StorageError("protocol error: bad dataset description (shape is not an array)");
    for (const auto& d : shape) i.sample_shape.push_back(count_field(d, kInfo));
    auto dt = parse_dtype(j.at("dtype").get<std::string>());
    auto lt = parse_dtype(j.at("label_dtype").get<std::string>());
    if (!dt || !lt) throw StorageError("protocol error: unknown dtype");
    i.dtype = *dt;
    i.label_dtype = *lt;
    i.sample_bytes = count_field(j.at("sample_bytes"), kInfo);
    i.has_labels = j.at("has_labels").get<bool>();
    i.label_bytes = count_field(j.at("label_bytes"), kInfo);
    i.layout = j.at("layout").get<std::string>();
    if (j.contains("seed")) i.seed = count_field(j["seed"], kInfo);
    if (j.contains("content")) {
      if (!j["content"].is_string() || j["content"] != "sparse")
        throw StorageError("protocol error: bad dataset description (content is not \"sparse\")");
      i.content = Content::sparse;
    }
  } catch (const nlohmann::json::exception& e) {
    throw StorageError(fmt::format("protocol error: bad dataset description ({})", e.what()));
  }
  return i;
}

}  // namespace solar::storage::wire

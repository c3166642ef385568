// SPDX-License-Identifier: Apache-2.0
#include "test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "solar/storage/content.h"

extern char** environ;

namespace solar::storage::test {
namespace fs = std::filesystem;

TempDir::TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "solar-storage-test-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

namespace {
pid_t spawn(const std::vector<std::string>& argv, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

int run(const std::vector<std::string>& argv, std::string* out) {
  char tmpl[] = "/tmp/solar-storage-run-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  if (fd < 0) return -1;
  ::close(fd);
  const pid_t pid = spawn(argv, tmpl);
  int status = -1;
  if (pid > 0) ::waitpid(pid, &status, 0);
  if (out) *out = slurp(tmpl);
  ::unlink(tmpl);
  if (pid <= 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool have_h5py() {
  static const bool ok =
      ::access("/usr/bin/python3", X_OK) == 0 &&
      run({"/usr/bin/python3", "-c", "import h5py, numpy"}) == 0;
  return ok;
}

StoredProcess::StoredProcess(const TempDir& dir, std::vector<std::string> args)
    : args_(std::move(args)) {
  static int n = 0;
  ++n;
  ready_ = dir.file("stored" + std::to_string(n) + ".ready");
  log_ = dir.file("stored" + std::to_string(n) + ".log");
}

StoredProcess::~StoredProcess() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  // Poll for a clean exit for a while, then force it.
  for (int i = 0; i < 500; ++i) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill_now();
}

void StoredProcess::kill_now() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

int StoredProcess::wait_exit() {
  int status = 0;
  if (pid_ <= 0) return -1;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool StoredProcess::start(std::uint16_t port) {
  std::error_code ec;
  fs::remove(ready_, ec);
  std::vector<std::string> argv{SOLAR_STORED, "--listen", "127.0.0.1:" + std::to_string(port),
                                "--ready-file", ready_};
  argv.insert(argv.end(), args_.begin(), args_.end());
  pid_ = spawn(argv, log_);
  if (pid_ <= 0) return false;
  for (int i = 0; i < 3000; ++i) {  // up to 30 s on a loaded machine
    if (fs::exists(ready_)) {
      const std::string s = slurp(ready_);
      port_ = static_cast<std::uint16_t>(std::stoul(s.substr(s.rfind(':') + 1)));
      return true;
    }
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

std::string StoredProcess::uri(const std::string& name) const {
  return "fabric://127.0.0.1:" + std::to_string(port_) + "/" + name;
}

std::string StoredProcess::log() const { return slurp(log_); }

std::string write(const TempDir& dir, const std::string& name, Layout layout,
                  std::uint64_t samples, std::vector<std::uint64_t> shape) {
  GenSpec s;
  s.path = dir.file(name);
  s.samples = samples;
  s.shape = std::move(shape);
  s.layout = layout;
  s.seed = 5;
  write_dataset(s);
  return s.path;
}

void expect_all(SampleSource& src, const std::vector<SampleRun>& runs) {
  const auto& info = src.info();
  std::vector<std::byte> buf(total_samples(runs) * info.sample_bytes);
  src.read(runs, buf.data());
  std::vector<std::int32_t> labels(total_samples(runs));
  src.read_labels(runs, reinterpret_cast<std::byte*>(labels.data()));
  std::size_t k = 0;
  for (const auto& r : runs)
    for (std::uint64_t i = r.first; i < r.first + r.count; ++i, ++k) {
      ASSERT_TRUE(content::check_sample(5, i, buf.data() + k * info.sample_bytes,
                                        info.sample_bytes))
          << src.describe() << " sample " << i;
      ASSERT_EQ(labels[k], content::label(5, i));
    }
}

::testing::AssertionResult holds_content(const std::byte* buf, std::uint64_t first,
                                         std::uint64_t count, std::uint64_t sample_bytes) {
  for (std::uint64_t i = 0; i < count; ++i)
    if (!content::check_sample(5, first + i, buf + i * sample_bytes, sample_bytes))
      return ::testing::AssertionFailure() << first + i;
  return ::testing::AssertionSuccess();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const StorageError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace solar::storage::test

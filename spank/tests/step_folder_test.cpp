// SPDX-License-Identifier: Apache-2.0
// What slurmstepd and the epilog open in folders a user controls (step_folder.h), and how the
// epilog signals a leftover agent (kill_if_agent). Run as root they also check files of
// another user (nobody).
#include "step_folder.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "agent_process.h"

namespace fs = std::filesystem;

namespace {
std::atomic<int> kills_by_pid{0};  // kill(2) calls of this program (kill_if_agent must use none)
}  // namespace

extern "C" int kill(pid_t pid, int sig) {
  using Real = int (*)(pid_t, int);
  static const Real real = reinterpret_cast<Real>(::dlsym(RTLD_NEXT, "kill"));
  ++kills_by_pid;
  return real(pid, sig);
}

namespace solar::spank {
namespace {

class StepFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/solar-step-folder-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ::chmod(dir_.c_str(), 01777);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(StepFolder, IsFoundInASetgidPlanDir) {
  // A group project space: plan_dir setgid, so the step's folder inherits S_ISGID (02700).
  ASSERT_EQ(::chmod(dir_.c_str(), 03777), 0);
  const std::string made = create_step_folder(dir_, 41, 2);
  struct stat st {};
  ASSERT_EQ(::stat(made.c_str(), &st), 0);
  EXPECT_TRUE(st.st_mode & S_ISGID);
  const auto found = find_step_folder(dir_, 41, 2, ::getuid());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(*found, made);
}

TEST_F(StepFolder, CreatedFreshPrivateAndFoundByItsOwnerOnly) {
  const std::string made = create_step_folder(dir_, 12, 3);
  struct stat st {};
  ASSERT_EQ(::lstat(made.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, ::getuid());
  EXPECT_EQ(fs::path(made).filename().string().rfind("solar-12.3.", 0), 0u) << made;
  const std::string second = create_step_folder(dir_, 12, 3);
  EXPECT_NE(second, made);  // never the same name twice
  fs::remove(made);
  fs::remove(second);
  const std::string mine = create_step_folder(dir_, 12, 3);
  // Names another user (or anyone) can take: none of them is the step's folder.
  std::ofstream(dir_ + "/solar-12.3.plan") << "x";                 // a file
  fs::create_directory(dir_ + "/solar-12.3.open");                 // a folder, not 0700
  ::chmod((dir_ + "/solar-12.3.open").c_str(), 0755);
  fs::create_directory_symlink(mine, dir_ + "/solar-12.3.link");  // a link to the real one
  fs::create_directory(dir_ + "/solar-12.30.other");               // another step
  ::chmod((dir_ + "/solar-12.30.other").c_str(), 0700);
  EXPECT_EQ(find_step_folder(dir_, 12, 3, ::getuid()), mine);
  EXPECT_EQ(find_step_folder(dir_, 12, 3, ::getuid() + 1), std::nullopt);
  EXPECT_EQ(find_step_folder(dir_, 12, 4, ::getuid()), std::nullopt);
  // Two of the user's own: the user made one by hand; refused rather than guessed.
  create_step_folder(dir_, 12, 3);
  EXPECT_THROW(find_step_folder(dir_, 12, 3, ::getuid()), std::runtime_error);
  EXPECT_EQ(job_folders(dir_, "solar-12.", ::getuid()).size(), 4u);  // not the link, the file
}

TEST_F(StepFolder, OpensOnlyARegularFileOfTheUserWithoutBlocking) {
  const std::string file = dir_ + "/agent.pid", fifo = dir_ + "/fifo", link = dir_ + "/link";
  std::ofstream(file) << "1234\n";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_symlink(file, link);
  EXPECT_EQ(read_owned_file(file, ::getuid(), 32), "1234\n");
  EXPECT_EQ(read_owned_file(file, ::getuid(), 2), "12");  // bounded
  EXPECT_EQ(read_owned_file(file, ::getuid() + 1, 32), std::nullopt);
  // A FIFO: refused at once (a plain open would wait for a writer for good).
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(read_owned_file(fifo, ::getuid(), 32), std::nullopt);
  EXPECT_EQ(errno, EPERM);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(open_owned_file(link, ::getuid()), -1);  // never through a link
  EXPECT_EQ(errno, ELOOP);
  if (::getuid() == 0) {
    const passwd* nobody = ::getpwnam("nobody");
    ASSERT_NE(nobody, nullptr);
    ASSERT_EQ(::chown(file.c_str(), nobody->pw_uid, nobody->pw_gid), 0);
    EXPECT_EQ(read_owned_file(file, 0, 32), std::nullopt);
    EXPECT_EQ(read_owned_file(file, nobody->pw_uid, 32), "1234\n");
  }
  const std::string fresh = dir_ + "/node0.log";
  const int fd = create_new_file(fresh);
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_EQ(create_new_file(fresh), -1);  // never an existing name
  EXPECT_EQ(create_new_file(fifo), -1);
}

// A process whose command line looks like an agent's: argv[0] the agent, --socket S.
pid_t fake_agent(const char* agent, const char* socket) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Its own group (its sleep is ended with it) and none of the test's output pipes (ctest
    // waits for those to close).
    ::setpgid(0, 0);
    const int null = ::open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; ++fd) ::dup2(null, fd);
    const char* argv[] = {agent, "-c", "sleep 100; true", "--socket", socket, nullptr};
    ::execv("/bin/sh", const_cast<char* const*>(argv));
    ::_exit(127);
  }
  // Until exec has replaced the command line.
  for (int i = 0; i < 500; ++i) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline");
    std::string a0;
    std::getline(f, a0, '\0');
    if (a0 == agent) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pid;
}

TEST(KillIfAgent, SignalsThroughAPidfdAndOnlyTheAgent) {
  const pid_t other = fake_agent("/opt/not-the-agent", "/run/s.sock");
  const pid_t agent = fake_agent("/opt/solar-agent", "/run/s.sock");
  kills_by_pid = 0;
  EXPECT_FALSE(kill_if_agent(other, ::getuid(), "/opt/solar-agent", "/run/s.sock"));
  EXPECT_FALSE(kill_if_agent(agent, ::getuid(), "/opt/solar-agent", "/run/other.sock"));
  EXPECT_FALSE(kill_if_agent(agent, ::getuid() + 1, "/opt/solar-agent", "/run/s.sock"));
  EXPECT_TRUE(kill_if_agent(agent, ::getuid(), "/opt/solar-agent", "/run/s.sock"));
  // By a pidfd opened before the checks, never kill(pid): a pid the agent left and another
  // process took meanwhile cannot be the one signalled.
  EXPECT_EQ(kills_by_pid.load(), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(agent, &status, 0), agent);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_EQ(::waitpid(other, &status, WNOHANG), 0) << "a process that is not the agent died";
  ::kill(-other, SIGKILL);
  ::kill(-agent, SIGKILL);  // the agent's sleep
  ::waitpid(other, &status, 0);
  EXPECT_FALSE(kill_if_agent(agent, ::getuid(), "/opt/solar-agent", "/run/s.sock"));  // gone
}

}  // namespace
}  // namespace solar::spank

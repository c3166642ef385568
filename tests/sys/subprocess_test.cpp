// SPDX-License-Identifier: Apache-2.0
// solar::sys's child processes (sys/include/solar/sys/subprocess.h): exit statuses as a shell
// gives them, what a child starts with (signals unblocked, the environment it is given), and
// running one with its output captured and a time limit.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "solar/sys/subprocess.h"

namespace solar::sys {
namespace {

TEST(Subprocess, ExitCodesAreAShellsAndTheEnvironmentIsTheOneGiven) {
  int st = 0;
  pid_t pid = spawn({"sh", "-c", "exit 3"}, current_environment());
  ASSERT_TRUE(wait_for(pid, 10, &st));
  EXPECT_EQ(exit_code_of(st), 3);
  pid = spawn({"sh", "-c", "kill -9 $$"}, current_environment());
  ASSERT_TRUE(wait_for(pid, 10, &st));
  EXPECT_EQ(exit_code_of(st), 128 + 9);
  pid = spawn({"/bin/sh", "-c", "test \"$SOLAR_SUBPROCESS_TEST\" = yes"},
              {"SOLAR_SUBPROCESS_TEST=yes"});
  ASSERT_TRUE(wait_for(pid, 10, &st));
  EXPECT_EQ(exit_code_of(st), 0);
}

TEST(Subprocess, AProgramThatCannotRunExits127) {
  SpawnOptions quiet;
  quiet.who = nullptr;
  int st = 0;
  const pid_t pid = spawn({"/nonexistent/solar-no-such-program"}, current_environment(), quiet);
  ASSERT_TRUE(wait_for(pid, 10, &st));
  EXPECT_EQ(exit_code_of(st), 127);
}

TEST(Subprocess, TheChildStartsWithSignalsUnblocked) {
  sigset_t usr1, old;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &usr1, &old), 0);
  std::string out, err;
  // SigBlk of /proc/self/status: the blocked signals, in hex (SIGUSR1 is bit 9 = 0x200).
  const int st = run_captured({"/bin/sh", "-c", "grep SigBlk /proc/self/status"}, 10, out, err);
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(WIFEXITED(st)) << err;
  EXPECT_EQ(out, "SigBlk:\t0000000000000000\n");
}

TEST(Subprocess, WaitingHasALimit) {
  const pid_t pid = spawn({"sleep", "5"}, current_environment());
  int st = 0;
  EXPECT_FALSE(wait_for(pid, 0.1, &st));
  ::kill(pid, SIGKILL);
  ASSERT_TRUE(wait_for(pid, 10, &st));
  EXPECT_EQ(exit_code_of(st), 128 + SIGKILL);
}

TEST(Subprocess, CapturesStdoutAndStderrApartWithStdinEmpty) {
  std::string out, err;
  const int st = run_captured({"/bin/sh", "-c", "cat; echo out; echo err >&2; exit 4"}, 10, out,
                              err);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 4);
  EXPECT_EQ(out, "out\n");
  EXPECT_EQ(err, "err\n");
}

TEST(Subprocess, ACapturedProgramThatCannotRunSaysWhy) {
  std::string out, err;
  // argv[0] is a path, not searched on PATH.
  const int st = run_captured({"sh", "-c", "true"}, 10, out, err);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 127);
  EXPECT_EQ(err, "cannot run sh: No such file or directory\n");
}

TEST(Subprocess, ACapturedProgramIsStoppedAtItsTimeLimit) {
  std::string out, err;
  const auto t0 = std::chrono::steady_clock::now();
  const int st = run_captured({"/bin/sh", "-c", "echo started; exec sleep 30"}, 1, out, err);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(st, -1);
  EXPECT_EQ(out, "started\n");
  EXPECT_EQ(err, "(stopped after 1 s)");
}

}  // namespace
}  // namespace solar::sys

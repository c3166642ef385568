// SPDX-License-Identifier: Apache-2.0
// A node's side: slurmstepd starts this node's agent as the job's user once per step
// (user_init), gives every task its SOLAR_* variables (task_init), stops the agent when the
// last local task is gone (task_exit) or at the latest in exit, and removes its folder. The job
// epilog (slurmd) sweeps whatever a crash left.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "solar/core/job_params.h"
#include "solar/core/plan_file.h"
#include "solar/sys/remove_tree.h"
#include "state.h"
#include "step_folder.h"

namespace solar::spank {
namespace {

constexpr std::uint32_t kFirstSpecialStep = 0xfffffff0;  // batch, extern, interactive steps

std::optional<std::string> job_env(spank_t sp, const char* name) {
  char buf[4096];
  if (spank_getenv(sp, name, buf, sizeof buf) != ESPANK_SUCCESS) return std::nullopt;
  return std::string(buf);
}

void set_task_env(spank_t sp, const char* name, const std::string& value) {
  if (spank_setenv(sp, name, value.c_str(), 1) != ESPANK_SUCCESS)
    throw std::runtime_error(fmt::format("cannot set {} for the tasks", name));
}

// The job's environment for the agent, minus the rank-side SOLAR_* variables.
std::vector<std::string> agent_environment(spank_t sp, const PluginConfig& pc) {
  std::vector<std::string> env;
  char** job = nullptr;
  if (spank_get_item(sp, S_JOB_ENV, &job) == ESPANK_SUCCESS && job)
    for (char** e = job; *e; ++e)
      if (std::strncmp(*e, "SOLAR_", 6) != 0 && std::strncmp(*e, "FI_PROVIDER=", 12) != 0)
        env.emplace_back(*e);
  if (!pc.provider.empty()) env.push_back("FI_PROVIDER=" + pc.provider);
  return env;
}

// The step's plan: the user's own regular file in the step's folder (opened without following
// a link or blocking on a FIFO), for this step's shape and within the site's limits. The root
// side takes what it enforces from here, not from the job's environment: srun checks the same
// first, but srun is the user's program and its checks can be skipped.
PlanHeader check_plan(const std::string& path, uid_t uid, std::uint32_t nodes,
                      std::uint32_t local_tasks, const PluginConfig& pc) {
  const int fd = open_owned_file(path, uid);
  if (fd < 0)
    throw std::runtime_error(fmt::format("the plan {} is not the job's user's own file ({})",
                                         path, std::strerror(errno)));
  PlanHeader h;
  try {
    h = PlanFile::open(fmt::format("/proc/self/fd/{}", fd)).header();  // the file checked
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  if (h.config.nodes != nodes || h.config.ranks_per_node != local_tasks)
    throw std::runtime_error(fmt::format("the plan {} is for {} nodes x {} ranks but this node "
                                         "runs {} of the step's {} nodes' tasks: solar needs the "
                                         "same number of tasks on every node",
                                         path, h.config.nodes, h.config.ranks_per_node,
                                         local_tasks, nodes));
  if (plan_is_transparent(h.config) && !pc.allow_transparent)
    throw std::runtime_error(fmt::format("the plan {} is for --solar-transparent, which this "
                                         "site does not allow (plugstack.conf transparent=no)",
                                         path));
  if (const auto cap = buffer_cap(pc, node_memory_bytes()); cap && h.config.buffer_bytes > *cap)
    throw std::runtime_error(fmt::format("the plan {} buffers {} per node, above the site's "
                                         "limit of {} on this node (plugstack.conf max_buffer=)",
                                         path, format_bytes(h.config.buffer_bytes),
                                         format_bytes(*cap)));
  if (h.config.tiered()) {
    if (pc.local_dir.empty())
      throw std::runtime_error(fmt::format("the plan {} keeps {} per node on a local disk, but "
                                           "this node's plugstack.conf has no local_dir=",
                                           path, format_bytes(h.config.local_bytes)));
    if (pc.max_local_buffer && h.config.local_bytes > *pc.max_local_buffer)
      throw std::runtime_error(fmt::format("the plan {} keeps {} per node on a local disk, "
                                           "above the site's limit of {} (plugstack.conf "
                                           "max_local_buffer=)",
                                           path, format_bytes(h.config.local_bytes),
                                           format_bytes(*pc.max_local_buffer)));
  }
  return h;
}

// The local tier's folder of this step on this node, once its agent is gone: the job's user's
// folder (never anything else: a link, another user's) is removed whatever it holds.
void remove_local_dir(const std::string& dir, uid_t uid) {
  struct stat st {};
  if (dir.empty() || ::lstat(dir.c_str(), &st) != 0) return;
  if (!S_ISDIR(st.st_mode) || st.st_uid != uid) {
    error(fmt::format("{} is not the job's user's folder; left as it is", dir));
    return;
  }
  if (!sys::remove_tree(dir)) error(fmt::format("could not remove {} entirely", dir));
}

}  // namespace

int start_node_agent(spank_t sp, State& s) {
  std::uint32_t job = 0, step = 0, nodes = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  if (spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS || step >= kFirstSpecialStep)
    return 0;
  if (s.options.off()) return 0;
  // SOLAR_STEP (srun's) only says where to look; what is trusted is the step's folder.
  const auto marker = job_env(sp, "SOLAR_STEP");
  if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS || !marker ||
      *marker != fmt::format("{}.{}", job, step))
    return 0;  // srun planned nothing for this step (solar off, or variables of an outer step)
  spank_get_item(sp, S_JOB_NODEID, &s.node);
  spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &s.local_tasks);
  spank_get_item(sp, S_JOB_NNODES, &nodes);
  spank_get_item(sp, S_JOB_UID, &uid);
  spank_get_item(sp, S_JOB_GID, &gid);
  // The step's folder in plan_dir, found from the step's ids and its owner.
  std::optional<std::string> folder;
  try {
    folder = find_step_folder(s.config.plan_dir, job, step, uid);
    if (!folder)
      throw std::runtime_error(fmt::format("the step's folder {}/{}* is not visible on this node: "
                                           "plan_dir in plugstack.conf must be shared by all "
                                           "nodes",
                                           s.config.plan_dir, step_folder_prefix(job, step)));
  } catch (const std::exception& e) {
    s.step_active = true;
    s.problem = e.what();
    s.fail_tasks = true;  // without a usable plan the ranks cannot read at all
    return 0;
  }
  s.step_active = true;
  set_task_env(sp, "SOLAR_NODE", std::to_string(s.node));

  const std::string plan = plan_in(*folder);
  PlanHeader header;
  try {
    header = check_plan(plan, uid, nodes, s.local_tasks, s.config);
  } catch (const std::exception& e) {
    s.problem = e.what();
    s.fail_tasks = true;  // without a usable plan the ranks cannot read at all
    return 0;
  }
  set_task_env(sp, "SOLAR_PLAN", plan);  // the plan checked here, whatever the job said

  AgentLaunch l;
  l.agent = s.config.agent;
  l.runtime_dir = s.config.runtime_dir;
  l.dir = step_runtime_dir(s.config, job, step, s.node);
  l.socket = l.dir + "/agent.sock";
  l.log = agent_log_in(*folder, s.node);
  l.args = {"--plan", plan, "--node", std::to_string(s.node),
            "--dataset", job_env(sp, "SOLAR_DATASET").value_or(""),
            "--labels", job_env(sp, "SOLAR_LABELS").value_or("/label"),
            "--socket", l.socket};
  if (s.config.zero_copy) l.args.push_back("--zero-copy");
  // A dataset of many files: the index srun wrote in the step's folder (the folder, found
  // from the step's ids and owner, is what is trusted; the agent checks every file against it).
  if (struct stat ist {}; ::lstat(index_in(*folder).c_str(), &ist) == 0 && S_ISREG(ist.st_mode))
    l.args.insert(l.args.end(), {"--dataset-index", index_in(*folder)});
  // The plan lies in a folder of the user's, who could replace it after check_plan: the agent
  // checks the site's limit again on the plan it reads.
  if (const auto cap = buffer_cap(s.config, node_memory_bytes()))
    l.args.insert(l.args.end(), {"--max-buffer", std::to_string(*cap)});
  // Resume: srun exported the start as the ranks read it (epoch, step within it).
  if (const auto se = job_env(sp, "SOLAR_START_EPOCH"), ss = job_env(sp, "SOLAR_START_STEP");
      se || ss) {
    try {
      const PlanHeader& h = header;
      auto num = [](const std::optional<std::string>& v) -> std::optional<std::uint64_t> {
        if (!v || v->empty()) return std::nullopt;
        return parse_job_param(*v, "SOLAR_START_STEP", job_params::kStartStep);
      };
      const std::uint64_t start = start_global_step(num(se), num(ss), h.layout.steps,
                                                    h.config.epochs, "SOLAR_START_EPOCH",
                                                    "SOLAR_START_STEP");
      if (start > 0) l.args.insert(l.args.end(), {"--start-step", std::to_string(start)});
    } catch (const std::exception& e) {
      s.problem = e.what();
      s.fail_tasks = true;  // the ranks would refuse it too
      return 0;
    }
  }
  // The modes follow from the plan checked above, never from the job's environment.
  const bool transparent = plan_is_transparent(header.config);
  if (transparent) l.args.push_back("--transparent");
  // --solar-order unknown (srun said so): demand mode from the start; the agent's own choice.
  if (transparent && job_env(sp, "SOLAR_ORDER_UNKNOWN").value_or("") == "1")
    l.args.push_back("--order-unknown");
  // --solar-peers: the folder in the step's folder; the agent (as the user) refuses it unless
  // it is the user's, 0700.
  if (header.config.peer_fetch)
    l.args.insert(l.args.end(), {"--peer-dir", peer_dir_in(*folder),
                                 "--peer-provider",
                                 s.config.provider.empty() ? "tcp;ofi_rxm" : s.config.provider});
  // A local tier: the agent (as the user) makes its folder in the site's local_dir.
  if (header.config.tiered()) {
    s.local_dir = step_local_dir(s.config, job, step, s.node);
    s.uid = uid;
    l.args.insert(l.args.end(), {"--local-dir", s.local_dir});
    if (s.config.max_local_buffer)
      l.args.insert(l.args.end(), {"--max-local-buffer", std::to_string(*s.config.max_local_buffer)});
  }
  l.env = agent_environment(sp, s.config);
  l.uid = uid;
  l.gid = gid;
  s.runtime_dir = l.dir;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    s.agent = AgentProcess::start(l, s.config.timeout_s);
    s.agent_ready_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // For the epilog sweep, should slurmstepd itself die; never trusted alone (kill_if_agent).
    if (const int fd = create_new_file(l.dir + "/agent.pid"); fd >= 0) {
      const std::string pid = fmt::format("{}\n", s.agent.pid());
      [[maybe_unused]] const ssize_t w = ::write(fd, pid.data(), pid.size());
      ::close(fd);
    }
    set_task_env(sp, "SOLAR_SOCKET", l.socket);
    if (transparent) {  // the admin's library (absolute path from plugstack.conf), never the user's
      std::string preload = s.config.preload;
      if (const auto prev = job_env(sp, "LD_PRELOAD"); prev && !prev->empty()) preload += ":" + *prev;
      set_task_env(sp, "LD_PRELOAD", preload);
    }
  } catch (const std::exception& e) {
    s.problem = fmt::format("the agent could not start: {}", e.what());
    s.fail_tasks = s.config.on_error == OnError::fail;
    error(fmt::format("node {}: {}", s.node, s.problem));
  }
  return 0;
}

int prepare_task(spank_t sp, State& s) {
  if (!s.step_active) return 0;
  int local = 0;
  spank_get_item(sp, S_TASK_ID, &local);
  set_task_env(sp, "SOLAR_LOCAL_RANK", std::to_string(local));
  // This runs in the task itself, right before exec: stderr is the task's, which srun shows.
  if (local == 0) {
    if (!s.problem.empty())
      std::fprintf(stderr, "solar: node %u: %s; %s\n", s.node, s.problem.c_str(),
                   s.fail_tasks ? "the step fails (on_error=fail in plugstack.conf)"
                                : "ranks read directly from storage (on_error=fallback)");
    else if (job_env(sp, "SOLAR_VERBOSE").value_or("0") == "1")
      std::fprintf(stderr, "solar: node %u: agent ready in %.0f ms\n", s.node, s.agent_ready_ms);
    std::fflush(stderr);
  }
  return s.fail_tasks ? -1 : 0;
}

int task_exited(spank_t, State& s) {
  if (!s.step_active) return 0;
  if (++s.tasks_exited >= s.local_tasks) s.agent.stop(kAgentStopGraceS);
  return 0;
}

int end_node_step(spank_t, State& s) {
  if (!s.step_active) return 0;
  s.agent.stop(1);
  if (!s.runtime_dir.empty()) sys::remove_tree(s.runtime_dir);
  remove_local_dir(s.local_dir, s.uid);
  return 0;
}

int sweep_job(spank_t sp, State& s) {
  std::uint32_t job = 0;
  uid_t uid = 0;
  if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS) return 0;
  if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS) {
    error(fmt::format("job {}: the epilog cannot read the job's user; nothing swept", job));
    return 0;
  }
  const std::string prefix = job_prefix(job);
  // One budget for all the removals of each folder kind, not one per folder: a user can make
  // any number of folders in plan_dir and keep filling the one being removed, which would
  // otherwise hold the epilog (and the node in COMPLETING) 30 s per folder.
  using Clock = std::chrono::steady_clock;
  constexpr auto kSweepBudget = std::chrono::seconds(30);
  auto left = [](Clock::time_point end) {
    return std::max(Clock::duration::zero(), end - Clock::now());
  };
  const auto runtime_end = Clock::now() + kSweepBudget;
  // runtime_dir is root's, so a folder solar-J.* of the user's there is a step's, made by
  // slurmstepd; its contents are the user's. The pid file is read as a file of the user's at
  // most (never a FIFO or a link), a few bytes, and its pid is only a candidate (kill_if_agent).
  for (const std::string& dir : job_folders(s.config.runtime_dir, prefix, uid)) {
    const auto text = read_owned_file(dir + "/agent.pid", uid, 32);
    pid_t pid = 0;
    if (text) std::from_chars(text->data(), text->data() + text->size(), pid);
    if (kill_if_agent(pid, uid, s.config.agent, dir + "/agent.sock"))
      info(fmt::format("job {}: killed a leftover agent (pid {})", job, pid));
    if (!sys::remove_tree(dir, left(runtime_end)))
      error(fmt::format("job {}: could not remove {} entirely", job, dir));
  }
  // The local tiers' folders in local_dir, the user's only (the agents are gone: above).
  if (!s.config.local_dir.empty())
    for (const std::string& dir : job_folders(s.config.local_dir, prefix, uid))
      if (!sys::remove_tree(dir, left(runtime_end)))
        error(fmt::format("job {}: could not remove {} entirely", job, dir));
  // The job's step folders in plan_dir (plan, agents' logs, peer cards): the user's folders
  // only (another user's names there are theirs). srun removes its step's at its exit, after
  // reading the agents' final stats from the logs (for kFinalStatsWaitS at most). For an
  // allocation srun made itself, that exit hook runs after srun has told slurmctld the job is
  // complete (Slurm calls it at process exit), so this epilog can run while srun still reads
  // them: removed under it, --solar-stats and --solar-verbose said "no agent log" for a node (a
  // flaky CI test). So srun is given that long (and a little more) to remove them itself; what
  // is left then (a crashed srun's) goes.
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int>((kFinalStatsWaitS + 3) * 1000));
  while (!job_folders(s.config.plan_dir, prefix, uid).empty() &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto plan_end = Clock::now() + kSweepBudget;
  for (const std::string& dir : job_folders(s.config.plan_dir, prefix, uid))
    if (!sys::remove_tree(dir, left(plan_end)))
      error(fmt::format("job {}: could not remove {} entirely", job, dir));
  return 0;
}

}  // namespace solar::spank

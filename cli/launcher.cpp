// SPDX-License-Identifier: Apache-2.0
#include "launcher.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <optional>
#include <memory>
#include <stdexcept>
#include <thread>

#include "line_labeller.h"
#include "run_dir.h"
#include "run_stats.h"
#include "solar/stats_file.h"
#include "solar/core/plan_file.h"
#include "solar/protocol.h"
#include "solar/sys/remove_tree.h"
#include "solar/sys/subprocess.h"
#include "solar/unix_socket.h"

extern char** environ;

namespace solar::cli {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string tail_of(const fs::path& file, std::size_t lines = 5) {
  std::ifstream f(file);
  std::vector<std::string> all;
  for (std::string l; std::getline(f, l);) all.push_back(l);
  std::string out;
  for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    // A long line (the stats JSON) is cut in the middle: an error's end says what follows.
    out += "\n    " + (all[i].size() > 400
                             ? all[i].substr(0, 200) + " ... " + all[i].substr(all[i].size() - 200)
                             : all[i]);
  return out;
}

}  // namespace

PlanConfig plan_for_run(const storage::DatasetInfo& info, const BufferSpec& buffer,
                        PlanConfig c, bool peers, bool rings) {
  const std::uint64_t label = info.has_labels ? info.label_bytes : 0;
  return config_for_agents(c, info.samples, info.sample_bytes, label,
                           buffer.resolve(info.samples, agent_slot_bytes(info.sample_bytes, label)),
                           peers, rings);
}

ScratchDir::ScratchDir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = (fs::path(base && *base ? base : "/tmp") / (prefix + "-XXXXXX")).string();
  if (!::mkdtemp(tmpl.data()))
    throw std::runtime_error(fmt::format("creating a scratch directory {}: {}", tmpl,
                                         std::strerror(errno)));
  path_ = tmpl;
}

ScratchDir::~ScratchDir() {
  if (!keep_) sys::remove_tree(path_);
}

std::string find_sibling(const std::string& name, const std::string& build_subdir) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    // Beside this program, in its build tree, or where the install puts libsolar's modules
    // (<prefix>/bin/solar -> <prefix>/<libdir>/solar/libsolar_preload.so).
    for (const fs::path& cand :
         {self.parent_path() / name, self.parent_path().parent_path() / build_subdir / name,
          (self.parent_path() / SOLAR_BIN_TO_LIBDIR / name).lexically_normal()})
      if (::access(cand.c_str(), X_OK) == 0) return cand.string();
  }
  return name;  // PATH
}

nlohmann::json agent_stats(const std::string& socket_path, double timeout_s) {
  const protocol::UnixConnection conn = protocol::connect_unix(socket_path);
  if (!conn)
    throw std::runtime_error(fmt::format("{}: no agent answers ({})", socket_path,
                                         std::strerror(conn.error)));
  const int fd = conn.fd;
  timeval tv{static_cast<time_t>(timeout_s), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char request[sizeof(protocol::Header)];
  protocol::put_header(request, protocol::Op::stats, 0);
  protocol::Header rh;
  std::string body;
  bool ok = ::send(fd, request, sizeof request, MSG_NOSIGNAL) == sizeof request &&
            ::recv(fd, &rh, sizeof rh, MSG_WAITALL) == sizeof rh && protocol::acceptable(rh) &&
            rh.op == static_cast<std::uint16_t>(protocol::Op::stats_reply);
  if (ok) {
    body.resize(rh.length);
    ok = ::recv(fd, body.data(), body.size(), MSG_WAITALL) == static_cast<ssize_t>(body.size());
  }
  ::close(fd);
  if (!ok) throw std::runtime_error(fmt::format("{}: no stats reply", socket_path));
  return nlohmann::json::parse(body);
}

LaunchResult launch(const LaunchSpec& spec) {
  const Plan& plan = *spec.plan;
  const PlanConfig& c = plan.config;
  LaunchResult result;

  // A private run directory: plan, sockets, agent logs. What killed runs left is swept first,
  // and a watchdog removes this one should this process be killed (see RunDirWatch).
  {
    const char* tmp = std::getenv("TMPDIR");
    sweep_leftover_run_dirs(tmp && *tmp ? tmp : "/tmp");
  }
  ScratchDir scratch("solar-run");
  std::optional<RunDirWatch> watch;
  if (spec.keep_run_dir) {
    scratch.keep();  // no owner file: never swept
  } else {
    std::ofstream(scratch.path() / kOwnerFile) << owner_line(::getpid()) << '\n';
    watch.emplace(scratch.path());
  }
  const fs::path& dir = scratch.path();
  const fs::path plan_path = dir / "plan";
  write_plan_file(plan, plan_path);
  result.times.plan_written = Clock::now();

  // Signals are taken synchronously (sigtimedwait); children get them unblocked.
  sigset_t sigs, old;
  sigemptyset(&sigs);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&sigs, s);
  ::sigprocmask(SIG_BLOCK, &sigs, &old);
  struct Restore {
    sigset_t old;
    ~Restore() { ::sigprocmask(SIG_SETMASK, &old, nullptr); }
  } restore{old};

  // The caller's environment, less the variables set below for each rank.
  static const char* const kOurs[] = {"SOLAR_PLAN=",        "SOLAR_NODE=",
                                      "SOLAR_LOCAL_RANK=",  "SOLAR_DATASET=",
                                      "SOLAR_LABELS=",      "SOLAR_SOCKET=",
                                      "SOLAR_START_EPOCH=", "SOLAR_START_STEP=",
                                      "SOLAR_DATASET_INDEX="};
  std::vector<std::string> base_env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    if (std::any_of(std::begin(kOurs), std::end(kOurs),
                    [&](const char* p) { return kv.rfind(p, 0) == 0; }))
      continue;
    base_env.push_back(kv);
  }
  if (spec.index) {
    const fs::path index_path = dir / "dataset.index";
    storage::write_index(*spec.index, index_path.string());
    base_env.push_back("SOLAR_DATASET_INDEX=" + index_path.string());
  }

  std::vector<pid_t> agents(c.nodes, -1);
  std::vector<std::string> sockets(c.nodes);
  // The local tier's folders (a plan with one): what an agent killed before its exit left is
  // removed once it has stopped (the sweep).
  std::vector<std::string> local_dirs(c.nodes);
  struct SweepLocal {
    const std::vector<std::string>& dirs;
    ~SweepLocal() {
      for (const std::string& d : dirs)
        if (!d.empty()) sys::remove_tree(d);
    }
  } sweep_local{local_dirs};
  auto stop_agents = [&](bool collect) {
    std::vector<std::string> no_answer(c.nodes);  // an agent that failed or died at the end
    for (std::uint32_t m = 0; m < c.nodes; ++m) {
      if (agents[m] <= 0) continue;
      if (collect) {
        try {
          result.agents.push_back(agent_stats(sockets[m]));
        } catch (const std::exception& e) {
          no_answer[m] = e.what();
        }
      }
      ::kill(agents[m], SIGTERM);
      ::kill(agents[m], SIGCONT);  // a stopped agent acts on it
    }
    for (std::uint32_t m = 0; m < c.nodes; ++m) {
      if (agents[m] <= 0) continue;
      int st = 0;
      if (!sys::wait_for(agents[m], 10, &st)) {
        ::kill(agents[m], SIGKILL);
        ::waitpid(agents[m], &st, 0);
        result.problems.push_back(fmt::format("node {}: agent did not stop on SIGTERM; killed", m));
      }
      if (!no_answer[m].empty())  // its own last words say why, not the socket's error
        result.problems.push_back(fmt::format(
            "node {}: the agent gave no statistics at the end of the run ({}) and exited with "
            "status {}; its log ends:{}",
            m, no_answer[m], sys::exit_code_of(st), tail_of(dir / fmt::format("node{}.log", m))));
      agents[m] = -1;
    }
  };

  std::vector<pid_t> ranks;
  std::unique_ptr<LineLabeller> labeller;  // -l: outlives the ranks (declared before them)
  try {
    if (spec.agents) {
      if (spec.peers && ::mkdir((dir / "peers").c_str(), 0700) != 0)
        throw std::runtime_error(fmt::format("creating {}: {}", (dir / "peers").string(),
                                             std::strerror(errno)));
      const std::string agent =
          spec.agent_path.empty() ? find_sibling("solar-agent", "agent") : spec.agent_path;
      if (c.tiered()) {
        for (std::uint32_t m = 0; m < c.nodes; ++m)
          local_dirs[m] = spec.local_dir.empty()
                              ? (dir / fmt::format("local-node{}", m)).string()
                              : (fs::path(spec.local_dir) /
                                 fmt::format("{}-node{}", dir.filename().string(), m))
                                    .string();
        if (!spec.local_dir.empty()) {  // outside the run folder: for the watchdog's removal
          std::ofstream list(dir / kLocalDirsFile);
          for (const std::string& d : local_dirs) list << d << '\n';
        }
      }
      for (std::uint32_t m = 0; m < c.nodes; ++m) {
        sockets[m] = (dir / fmt::format("node{}.sock", m)).string();
        const std::string log = (dir / fmt::format("node{}.log", m)).string();
        std::vector<std::string> argv = {agent,          "--plan",   plan_path.string(),
                                         "--node",       std::to_string(m),
                                         "--dataset",    spec.dataset,
                                         "--labels",     spec.labels,
                                         "--socket",     sockets[m],
                                         "--log",        log};
        if (spec.zero_copy) argv.push_back("--zero-copy");
        if (spec.direct_io) argv.push_back("--direct-io");
        if (spec.read_gap > 0) {
          argv.push_back("--read-gap");
          argv.push_back(std::to_string(spec.read_gap));
        }
        if (spec.transparent) argv.push_back("--transparent");
        if (spec.order_unknown) argv.push_back("--order-unknown");
        if (spec.peers) {
          argv.insert(argv.end(), {"--peer-dir", (dir / "peers").string(), "--peer-provider",
                                   spec.peer_provider, "--peer-timeout",
                                   fmt::format("{}", spec.peer_timeout)});
        }
        if (c.tiered()) argv.insert(argv.end(), {"--local-dir", local_dirs[m]});
        if (spec.start_step > 0) {
          argv.push_back("--start-step");
          argv.push_back(std::to_string(spec.start_step));
        }
        if (!spec.stats_out.empty()) {
          argv.push_back("--stats-out");
          argv.push_back((dir / fmt::format("node{}.stats.json", m)).string());
        }
        result.times.agent_spawned.push_back(Clock::now());
        sys::SpawnOptions to_log;
        to_log.log = log;
        agents[m] = sys::spawn(argv, base_env, to_log);
        if (watch) watch->agent(agents[m]);
      }
      // Ready when its socket accepts a connection.
      const auto deadline = Clock::now() + std::chrono::seconds(60);
      for (std::uint32_t m = 0; m < c.nodes; ++m) {
        for (;;) {
          if (const protocol::UnixConnection conn = protocol::connect_unix(sockets[m])) {
            ::close(conn.fd);
            break;
          }
          int st = 0;
          if (::waitpid(agents[m], &st, WNOHANG) == agents[m]) {
            agents[m] = -1;
            if (WIFSIGNALED(st)) {
              // Killed (the OOM killer, an operator, the soak's chaos): as when it dies during
              // the run, its ranks read directly. An agent that exits by itself refuses the
              // job's settings, and stops the job with its reason (below).
              std::fprintf(stderr,
                           "solar run: node %u: the agent was killed (signal %d) before it was "
                           "ready; its ranks read directly\n",
                           m, WTERMSIG(st));
              break;
            }
            throw std::runtime_error(fmt::format(
                "the agent of node {} exited ({}) before it was ready:{}", m, sys::exit_code_of(st),
                tail_of(dir / fmt::format("node{}.log", m))));
          }
          if (Clock::now() > deadline)
            throw std::runtime_error(fmt::format("the agent of node {} was not ready in 60 s:{}",
                                                 m, tail_of(dir / fmt::format("node{}.log", m))));
          // Every millisecond here delays the ranks' start (a connect attempt costs microseconds).
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      }
    }

    if (spec.agents) result.times.agents_ready = Clock::now();
    if (spec.agents && spec.verbose)
      std::fprintf(stderr, "solar run: %u agent%s ready; watch them with: solar stat %s --watch\n",
                   c.nodes, c.nodes == 1 ? "" : "s", dir.c_str());

    // Ranks: node-major, like srun's block distribution.
    const std::uint64_t W = c.world();
    const int master_port = 29500 + static_cast<int>(::getpid() % 20000);
    const auto t0 = Clock::now();
    result.times.ranks_spawned = t0;
    const std::size_t label_width = std::to_string(W > 0 ? W - 1 : 0).size();
    if (spec.label_lines) labeller = std::make_unique<LineLabeller>();
    for (std::uint32_t m = 0; m < c.nodes; ++m)
      for (std::uint32_t r = 0; r < c.ranks_per_node; ++r) {
        std::vector<std::string> env = base_env;
        const std::uint64_t rank = std::uint64_t{m} * c.ranks_per_node + r;
        for (const std::string& kv :
             {fmt::format("SOLAR_PLAN={}", plan_path.string()), fmt::format("SOLAR_NODE={}", m),
              fmt::format("SOLAR_LOCAL_RANK={}", r), fmt::format("SOLAR_DATASET={}", spec.dataset),
              fmt::format("SOLAR_LABELS={}", spec.labels), fmt::format("RANK={}", rank),
              fmt::format("WORLD_SIZE={}", W), fmt::format("LOCAL_RANK={}", r),
              fmt::format("LOCAL_WORLD_SIZE={}", c.ranks_per_node),
              fmt::format("NODE_RANK={}", m), std::string("MASTER_ADDR=127.0.0.1"),
              fmt::format("MASTER_PORT={}", master_port)})
          env.push_back(kv);
        if (spec.agents) env.push_back(fmt::format("SOLAR_SOCKET={}", sockets[m]));
        if (spec.start_step > 0) {
          const std::uint64_t spe = std::max<std::uint64_t>(spec.plan->layout.steps, 1);
          env.push_back(fmt::format("SOLAR_START_EPOCH={}", spec.start_step / spe));
          env.push_back(fmt::format("SOLAR_START_STEP={}", spec.start_step % spe));
        }
        if (spec.agents && spec.transparent) {
          std::string preload = spec.preload_path.empty()
                                    ? find_sibling("libsolar_preload.so", "interpose")
                                    : spec.preload_path;
          if (const char* prev = std::getenv("LD_PRELOAD"); prev && *prev)
            preload += ":" + std::string(prev);
          std::erase_if(env, [](const std::string& kv) { return kv.starts_with("LD_PRELOAD="); });
          env.push_back("LD_PRELOAD=" + preload);
        }
        for (const auto& kv : spec.extra_env) env.push_back(kv);
        if (labeller) {
          const std::string label = fmt::format("{:>{}}: ", rank, label_width);
          const int out = labeller->add(1, label), err = labeller->add(2, label);
          const pid_t pid = [&] {
            try {
              sys::SpawnOptions to_pipes;
              to_pipes.out = out;
              to_pipes.err = err;
              return sys::spawn(spec.command, env, to_pipes);
            } catch (...) {
              ::close(out);
              ::close(err);
              throw;
            }
          }();
          ::close(out);
          ::close(err);
          ranks.push_back(pid);
        } else {
          ranks.push_back(sys::spawn(spec.command, env));
        }
      }
    if (labeller) labeller->start();

    // Wait for every rank; forward signals (a second Ctrl-C kills).
    std::map<pid_t, std::size_t> live;
    for (std::size_t i = 0; i < ranks.size(); ++i) live[ranks[i]] = i;
    int interrupts = 0;
    while (!live.empty()) {
      timespec tick{0, 200'000'000};
      const int sig = ::sigtimedwait(&sigs, nullptr, &tick);
      if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
        ++interrupts;
        for (const auto& [pid, i] : live) ::kill(pid, interrupts > 1 ? SIGKILL : sig);
        if (result.exit_code == 0) result.exit_code = 128 + sig;
      }
      for (;;) {
        int st = 0;
        const pid_t pid = ::waitpid(-1, &st, WNOHANG);
        if (pid <= 0) break;
        if (live.erase(pid)) {
          result.exit_code = std::max(result.exit_code, sys::exit_code_of(st));
        } else {
          for (std::uint32_t m = 0; m < c.nodes; ++m)
            if (agents[m] == pid) {
              agents[m] = -1;
              result.problems.push_back(fmt::format("node {}: the agent exited ({}) during the "
                                                    "run; its ranks read directly:{}",
                                                    m, sys::exit_code_of(st),
                                                    tail_of(dir / fmt::format("node{}.log", m))));
            }
        }
      }
    }
    result.times.ranks_exited = Clock::now();
    result.seconds = std::chrono::duration<double>(result.times.ranks_exited - t0).count();
    if (labeller) labeller->finish(1.0);
    stop_agents(true);
    result.times.agents_stopped = Clock::now();
    if (!spec.stats_out.empty())
      // A streamed plan's metrics are not known here (each node computed its share).
      write_run_stats(spec.stats_out, dir, c.nodes, spec.agents,
                      plan.streamed ? nlohmann::json()
                                    : protocol::plan_metrics_record(plan.metrics));
  } catch (...) {
    for (pid_t p : ranks) ::kill(p, SIGKILL);
    for (pid_t p : ranks) ::waitpid(p, nullptr, 0);
    stop_agents(false);
    throw;
  }
  if (spec.keep_run_dir) std::fprintf(stderr, "solar run: kept %s\n", dir.c_str());
  return result;
}

}  // namespace solar::cli

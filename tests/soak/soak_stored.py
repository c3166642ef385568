# SPDX-License-Identifier: Apache-2.0
"""The long-lived solar-stored the fabric jobs read from: started on a free port, restarted on the
same one after a kill, its descriptors, threads and RSS watched between jobs."""
import os
import signal
import subprocess
import time
from soak_env import GRACE_S, STOPPING, STORED
from soak_procs import Pid, fd_count, proc_stat, status_field, wait_until


class Stored:
    def __init__(self, workdir, exports):
        self.workdir, self.exports = workdir, exports
        self.proc, self.addr, self.starts, self.log_file = None, None, 0, None
        self.start("127.0.0.1:0")

    def start(self, listen):
        if STOPPING.is_set():
            raise RuntimeError("the soak is stopping: solar-stored is not restarted")
        self.starts += 1
        ready = os.path.join(self.workdir, f"stored-{self.starts}.ready")
        if self.log_file:
            self.log_file.close()
        self.log_path = os.path.join(self.workdir, "stored.log")
        self.log_file = open(self.log_path, "a")
        deadline = time.monotonic() + 15
        while True:
            args = [STORED, "--listen", listen, "--ready-file", ready]
            for name, path in self.exports.items():
                args += ["--export", f"{name}={path}"]
            self.proc = subprocess.Popen(args, stdout=self.log_file, stderr=subprocess.STDOUT,
                                         start_new_session=True)
            ok = wait_until(lambda: self.proc.poll() is not None or
                            (os.path.exists(ready) and open(ready).read().strip()), 15)
            if ok and self.proc.poll() is None:
                break
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            if time.monotonic() > deadline:  # the port still taken, or it cannot start
                raise RuntimeError(f"solar-stored does not start on {listen}: see {self.log_path}")
            time.sleep(0.3)
        self.addr = open(ready).read().strip()
        st = proc_stat(self.proc.pid)
        self.pid = Pid(self.proc.pid, st[3], "solar-stored")
        time.sleep(0.2)
        self.base_fds = fd_count(self.proc.pid)
        self.base_threads = status_field(self.proc.pid, "Threads")
        self.base_rss = status_field(self.proc.pid, "VmRSS") * 1024
        self.max_rss_growth = 0

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        self.pid.signal(signal.SIGCONT)
        self.pid.signal(signal.SIGKILL)
        self.proc.wait()

    def restart(self):
        self.start(self.addr)

    def idle_check(self):
        """(fds, threads) in excess of the baseline once every client has left, or None."""
        if not self.alive():
            return None
        ok = wait_until(lambda: (fd_count(self.proc.pid) or 0) <= self.base_fds and
                        (status_field(self.proc.pid, "Threads") or 0) <= self.base_threads, GRACE_S)
        rss = (status_field(self.proc.pid, "VmRSS") or 0) * 1024
        self.max_rss_growth = max(self.max_rss_growth, rss - self.base_rss)
        if ok:
            return None
        return (fd_count(self.proc.pid) - self.base_fds,
                status_field(self.proc.pid, "Threads") - self.base_threads)

    def stop(self):
        if self.alive():
            self.pid.signal(signal.SIGCONT)
            self.pid.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.pid.signal(signal.SIGKILL)
                self.proc.wait()
        if self.log_file:
            self.log_file.close()
            self.log_file = None

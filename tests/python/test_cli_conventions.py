# SPDX-License-Identifier: Apache-2.0
"""Command-line conventions of the solar programs, from the outside: typed numeric options in
--help, bad numbers named, `solar run -n` counting ranks as srun/mpirun do, `solar run -l`
labelling lines as `srun -l` does, `solar gen` refusing surprising sizes, and the progress bar
drawn only on a terminal."""
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time

import pytest

from conftest import solar_bin

SOLAR = solar_bin()
BUILD = os.path.dirname(os.path.dirname(SOLAR))
SUBCOMMANDS = [["plan"], ["plan-dump"], ["gen"], ["verify"], ["dataset-info"], ["bench", "io"],
               ["bench", "loader"], ["bench", "serve"], ["run"], ["stat"]]
OPTION = re.compile(r"^\s+((?:-\w,)?--[\w-]+)(?: (\S+))?")


def solar(*args, **kw):
    return subprocess.run([SOLAR, *map(str, args)], capture_output=True, text=True,
                          timeout=kw.pop("timeout", 120), **kw)


def options(help_text):
    """{'--epochs': 'UINT', '-n,--ntasks': 'UINT', '--json': None, ...} from CLI11's --help."""
    out = {}
    for line in help_text.splitlines():
        m = OPTION.match(line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "tiny.h5"
    p = solar("gen", path, "--samples", "96", "--preset", "tiny", "--seed", "1", "--no-progress")
    assert p.returncode == 0, p.stderr
    return str(path)


# ------------------------------------------------------------------------- typed --help

def test_run_help_shows_the_types_of_its_numbers():
    opts = options(solar("run", "--help").stdout)
    assert opts["-n,--ntasks"] == "UINT"
    assert opts["--ranks-per-node"] == "UINT"
    for name in ("--nodes", "--epochs", "--batch", "--seed", "--imbalance"):
        assert opts[name] == "UINT", (name, opts)
    assert opts["--buffer"] == "SIZE"
    assert opts["--dataset"] == "SOURCE"
    assert opts["-l,--label"] is None  # a flag


@pytest.mark.parametrize("sub", SUBCOMMANDS, ids=" ".join)
def test_every_option_of_every_subcommand_is_typed(sub):
    p = solar(*sub, "--help")
    assert p.returncode == 0, p.stderr
    opts = options(p.stdout)
    assert opts, p.stdout
    untyped = {k: v for k, v in opts.items() if v is not None and v.startswith("TEXT")}
    assert not untyped, f"solar {' '.join(sub)}: options shown as TEXT: {untyped}"


@pytest.mark.parametrize("program,option,type_name", [
    ("agent/solar-agent", "--node", "UINT"),
    ("agent/solar-agent", "--io-threads", "UINT"),
    ("storage/solar-stored", "--staging-bytes", "SIZE"),
    ("storage/solar-stored", "--throttle-bandwidth", "SIZE"),
    ("storage/solar-stored", "--throttle-latency", "FLOAT"),
    ("slurm_examples/solar-example-train", "--baseline", "UINT"),
    ("slurm_examples/solar-example-train", "--compute-ms", "FLOAT"),
])
def test_other_programs_type_their_numbers(program, option, type_name):
    path = os.path.join(BUILD, program)
    if not os.access(path, os.X_OK):
        pytest.skip(f"{program} is not built")
    p = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30)
    assert options(p.stdout).get(option) == type_name, p.stdout


@pytest.mark.parametrize("args,flag", [
    (["run", "--epochs", "x"], "--epochs"),
    (["run", "-n", "x"], "--ntasks"),
    (["run", "-n", "-4"], "--ntasks"),
    (["run", "--ranks-per-node", "2.5"], "--ranks-per-node"),
    (["run", "--nodes", "0"], "--nodes"),
    (["run", "--batch", "99999999999999999999"], "--batch"),
    (["run", "--buffer", "lots"], "--buffer"),
    (["gen", "OUT", "--samples", "x"], "--samples"),
    (["gen", "OUT", "--samples", "10", "--seed", "y"], "--seed"),
    (["verify", "SRC", "--threads", "x"], "--threads"),
    (["verify", "SRC", "--timeout", "-1"], "--timeout"),
    (["verify", "SRC", "--sample", "many"], "--sample"),
    (["plan-dump", "F", "--node", "x"], "--node"),
    (["bench", "loader", "--dataset", "D", "--nodes", "x"], "--nodes"),
    (["bench", "loader", "--dataset", "D", "-n", "x"], "--ntasks"),
    (["bench", "serve", "-n", "x"], "--ntasks"),
    (["bench", "serve", "--repeat", "0"], "--repeat"),
])
def test_a_bad_number_is_named(tmp_path, args, flag):
    argv = [str(tmp_path / "o.h5") if a == "OUT" else a for a in args]
    if args[0] == "run":  # the other required options, valid
        given = set(args)
        for name, value in (("--dataset", tmp_path / "missing.h5"), ("--buffer", "1M"),
                            ("--epochs", "1"), ("--batch", "1")):
            if name not in given:
                argv += [name, str(value)]
        argv += ["--", "true"]
    p = solar(*argv, cwd=tmp_path)
    assert p.returncode == 2, (argv, p.stdout, p.stderr)
    assert flag in p.stderr, p.stderr
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------- solar run -n

RANK_ENV = 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $NODE_RANK $SOLAR_NODE"'


def run_ranks(dataset, *args, tmp_path=None):
    p = solar("run", *args, "--no-agent", "--dataset", dataset, "--buffer", "50%", "--epochs", "1",
              "--batch", "2", "--", "sh", "-c", RANK_ENV, timeout=120)
    return p, sorted(tuple(map(int, line.split())) for line in p.stdout.splitlines())


@pytest.mark.parametrize("args", [["-n", "4", "--nodes", "2"],
                                  ["--ntasks", "4", "--nodes", "2"],
                                  ["--ranks-per-node", "2", "--nodes", "2"],
                                  ["-n", "4", "--ranks-per-node", "2", "--nodes", "2"]])
def test_n_is_the_total_like_srun(dataset, args):
    p, ranks = run_ranks(dataset, *args)
    assert p.returncode == 0, p.stderr
    # rank, world, local rank, local world, node (twice): 2 nodes × 2 ranks, node-major.
    assert ranks == [(0, 4, 0, 2, 0, 0), (1, 4, 1, 2, 0, 0), (2, 4, 0, 2, 1, 1),
                     (3, 4, 1, 2, 1, 1)], p.stdout


def test_n_alone_is_one_node_and_nothing_is_one_rank_per_node(dataset):
    p, ranks = run_ranks(dataset, "-n", "3")
    assert p.returncode == 0, p.stderr
    assert [r[:4] for r in ranks] == [(0, 3, 0, 3), (1, 3, 1, 3), (2, 3, 2, 3)]
    p, ranks = run_ranks(dataset, "--nodes", "3")
    assert p.returncode == 0, p.stderr
    assert [(r[0], r[1], r[3], r[4]) for r in ranks] == [(0, 3, 1, 0), (1, 3, 1, 1), (2, 3, 1, 2)]


@pytest.mark.parametrize("args,words", [
    (["-n", "3", "--nodes", "2"], ["-n/--ntasks", "3", "divide evenly", "--nodes 2",
                                   "-n 4 --nodes 2", "--ranks-per-node 2 --nodes 2"]),
    (["-n", "1", "--nodes", "2"], ["-n/--ntasks", "divide evenly"]),
    (["-n", "4", "--ranks-per-node", "3", "--nodes", "2"], ["-n/--ntasks", "disagrees",
                                                            "--ranks-per-node 3", "6 ranks"]),
    (["-n", "2048"], ["-n/--ntasks", "per node", "1..1024"]),
])
def test_n_that_does_not_fit_the_nodes_is_refused(dataset, tmp_path, args, words):
    p = solar("run", *args, "--no-agent", "--dataset", dataset, "--buffer", "50%", "--epochs",
              "1", "--batch", "2", "--", "touch", tmp_path / "ran")
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert not (tmp_path / "ran").exists()


def test_bench_loader_counts_ranks_the_same_way(tmp_path):
    p = solar("bench", "loader", "--dataset", tmp_path / "d.h5", "-n", "6", "--nodes", "4")
    assert p.returncode == 2 and "-n/--ntasks" in p.stderr and "divide evenly" in p.stderr, \
        p.stderr
    p = solar("bench", "loader", "--dataset", tmp_path / "d.h5", "-n", "8",
              "--ranks-per-node", "2", "--nodes", "2")
    assert p.returncode == 2 and "disagrees" in p.stderr, p.stderr
    # The old, ambiguous --ranks (per node) is gone rather than silently reinterpreted.
    p = solar("bench", "loader", "--dataset", tmp_path / "d.h5", "--ranks", "4")
    assert p.returncode == 2 and "--ranks" in p.stderr, p.stderr


# ------------------------------------------------------------------------- solar run -l

WRITER = r"""
import os, sys, time
rank = int(os.environ["RANK"])
ch = "abcdefghijklmnop"[rank].encode()
for i in range(60):
    line = ch * 3000 + b" %d\n" % i
    fd = 1 if i % 2 == 0 else 2
    # One line in three writes, with pauses: other ranks write in between.
    for a, b in ((0, 1000), (1000, 2000), (2000, len(line))):
        os.write(fd, line[a:b])
        time.sleep(0.0005)
os.write(1, b"no newline at the end")
"""


def test_label_prefixes_every_line_with_its_rank_and_keeps_lines_whole(dataset, tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    p = solar("run", "-l", "-n", "4", "--nodes", "2", "--no-agent", "--dataset", dataset,
              "--buffer", "50%", "--epochs", "1", "--batch", "2", "--", sys.executable, script)
    assert p.returncode == 0, p.stderr
    for stream, parity in ((p.stdout, 0), (p.stderr, 1)):
        seen = {r: [] for r in range(4)}
        for line in stream.splitlines():
            if line.startswith("solar run: "):  # solar's own summary (stderr)
                continue
            m = re.fullmatch(r"(\d+): (.*)", line)
            assert m, line[:80]
            rank, text = int(m.group(1)), m.group(2)
            ch = "abcd"[rank]
            if text == "no newline at the end":
                seen[rank].append("end")
                continue
            body, _, i = text.rpartition(" ")
            assert body == ch * 3000, f"line of rank {rank} cut or mixed: {text[:60]}..."
            seen[rank].append(int(i))
        for rank, got in seen.items():
            want = list(range(parity, 60, 2)) + (["end"] if parity == 0 else [])
            assert got == want, (rank, got)


def test_label_width_follows_the_widest_rank_like_srun(dataset):
    p = solar("run", "--label", "-n", "12", "--no-agent", "--dataset", dataset, "--buffer", "100%",
              "--epochs", "1", "--batch", "1", "--", "sh", "-c", 'echo "r$RANK"')
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == sorted(
        [f"{r:>2}: r{r}" for r in range(12)]), p.stdout


def test_without_label_ranks_write_straight_through(dataset):
    p = solar("run", "-n", "2", "--no-agent", "--dataset", dataset, "--buffer", "50%", "--epochs",
              "1", "--batch", "2", "--", "sh", "-c", 'echo "r$RANK"; printf tail')
    assert p.returncode == 0, p.stderr
    assert sorted(re.findall(r"r\d", p.stdout)) == ["r0", "r1"]
    assert not re.search(r"^\d+: ", p.stdout, re.M), p.stdout


def test_label_keeps_the_worst_exit_status(dataset):
    p = solar("run", "-l", "-n", "2", "--no-agent", "--dataset", dataset, "--buffer", "50%",
              "--epochs", "1", "--batch", "2", "--", "sh", "-c", 'echo bye; exit $((RANK + 3))')
    assert p.returncode == 4, p.stderr
    assert sorted(p.stdout.splitlines()) == ["0: bye", "1: bye"]


# ------------------------------------------------------------------------- solar gen sizes

def test_gen_refuses_more_than_the_free_space(tmp_path):
    out = tmp_path / "huge.h5"
    p = solar("gen", out, "--samples", "2147483647", "--preset", "cosmoflow", "--yes")
    assert p.returncode == 2, p.stderr
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1, p.stderr
    assert "--samples" in line and "32.0 PiB" in line and "free on" in line and \
        "nothing written" in line, line
    assert list(tmp_path.iterdir()) == []


def test_gen_wants_yes_above_10_gib(tmp_path):
    out = tmp_path / "big.h5"
    need = 680 * (16 * 2**20 + 4)  # 10.6 GiB
    p = solar("gen", out, "--samples", "680", "--preset", "cosmoflow")
    assert p.returncode == 2, p.stderr
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1, p.stderr
    assert "10.6 GiB" in line and "680 samples of 16.0 MiB" in line, line
    if shutil.disk_usage(tmp_path).free > need + 2**20:
        assert "pass --yes" in line, line
    else:  # this machine lacks the space: the harder refusal comes first
        assert "free on" in line, line
    assert list(tmp_path.iterdir()) == []


def test_gen_small_is_quiet_and_needs_no_yes(tmp_path):
    p = solar("gen", tmp_path / "s.h5", "--samples", "10", "--preset", "tiny", "--no-progress")
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    assert "wrote" in p.stdout


def test_gen_help_documents_the_limits():
    text = solar("gen", "--help").stdout
    assert "--yes" in text and "10 GiB" in text and "free space" in text


# ------------------------------------------------------------------------- progress bar

PLAN = ["plan", "--samples", "1000000", "--epochs", "8", "--batch", "16", "--nodes", "4",
        "--ranks-per-node", "4", "--sample-bytes", "1K", "--buffer", "20%"]


def on_a_terminal(args):
    """Runs solar with stderr on a pseudo-terminal (stdout a pipe); returns (stderr, seconds)."""
    master, slave = pty.openpty()
    t0 = time.monotonic()
    p = subprocess.Popen([SOLAR, *args], stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        r, _, _ = select.select([master], [], [], 120)
        if not r:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        out += chunk
    p.wait(timeout=120)
    os.close(master)
    assert p.returncode == 0, out
    return out.decode(errors="replace"), time.monotonic() - t0


def test_progress_bar_only_on_a_terminal_and_only_for_long_work():
    err, seconds = on_a_terminal(PLAN)
    if seconds > 1.5:  # long enough for the bar (it waits a second)
        assert re.search(r"\rplanning solar \[#* *\] +\d+%", err), repr(err[-300:])
        assert err.endswith("\r\033[K"), repr(err[-40:])  # the line is erased at the end
    err, _ = on_a_terminal([*PLAN, "--no-progress"])
    assert "planning" not in err
    p = solar(*PLAN)  # stderr a pipe: no bar
    assert p.returncode == 0 and p.stderr == "", p.stderr[-200:]

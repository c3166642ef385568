# SPDX-License-Identifier: Apache-2.0
"""The package as a user gets it: the wheel (a platform wheel carrying libsolar) installed with
pip into a fresh venv, and a DDP script (python/examples/train_ddp.py) run from it under
`solar run`, from a directory outside the checkout, without SOLAR_LIBRARY: int64 labels, and a
run interrupted mid-epoch and resumed from its checkpoint gets exactly the batches (indices,
bytes, labels) and the final model of an uninterrupted run."""
import glob
import os
import shutil
import sysconfig
import zipfile

import pytest

import solar
from conftest import BUILD, REPO, SOLAR, run

pytest.importorskip("torch")

PKG = os.path.join(REPO, "python")
EXAMPLE = os.path.join(PKG, "examples", "train_ddp.py")
LIB = os.environ.get("SOLAR_LIBRARY") or os.path.join(BUILD, "client", "libsolar.so")
PY = "/usr/bin/python3"  # Debian's: numpy, h5py, torch; pip, setuptools and wheel


def user_env(**extra):
    """A user's environment: no SOLAR_* (no SOLAR_LIBRARY), no PYTHONPATH into the checkout;
    pip offline."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SOLAR_") and k not in ("PYTHONPATH", "LOCAL_RANK")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1", **extra)
    return env


def build_wheel(out, **env):
    return run(PY, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-cache-dir",
               PKG, "-w", out, env=user_env(**env), check=False)


def source_tree_is_clean():
    return not any(os.path.exists(os.path.join(PKG, p)) for p in ("build", "dist")) and \
        not glob.glob(os.path.join(PKG, "*.egg-info"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    p = build_wheel(out, SOLAR_LIBRARY=LIB)
    assert p.returncode == 0, p.stdout + p.stderr
    wheels = glob.glob(str(out / "*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_is_a_platform_wheel_carrying_libsolar(wheel):
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert os.path.basename(wheel) == f"solar_loader-{solar.__version__}-py3-none-{plat}.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert {"solar/__init__.py", "solar/_lib.py", "solar/loader.py", "solar/torch.py",
                "solar/batch.py", "solar/dataset.py", "solar/errors.py",
                "solar/libsolar.so", "solar/libsolar-direct.so"} <= names, names
        with open(os.path.realpath(LIB), "rb") as f:
            assert z.read("solar/libsolar.so") == f.read()  # this build's library
        # and its direct path's module, which libsolar opens from beside itself
        with open(os.path.join(os.path.dirname(os.path.realpath(LIB)), "libsolar-direct.so"),
                  "rb") as f:
            assert z.read("solar/libsolar-direct.so") == f.read()
        meta = z.read(f"solar_loader-{solar.__version__}.dist-info/WHEEL").decode()
        assert "Root-Is-Purelib: false" in meta and f"Tag: py3-none-{plat}" in meta, meta
    soname = run("readelf", "-d", os.path.realpath(LIB)).stdout
    assert "Library soname: [libsolar.so.0]" in soname
    assert source_tree_is_clean()


def test_wheel_without_the_library_is_refused_unless_asked(tmp_path):
    p = build_wheel(tmp_path / "a", SOLAR_BUILD_DIR=str(tmp_path / "no-build"))
    assert p.returncode != 0
    assert "solar wheel: no libsolar.so to put in the wheel" in p.stdout + p.stderr
    assert "SOLAR_WHEEL_WITHOUT_LIBRARY=1" in p.stdout + p.stderr
    assert not glob.glob(str(tmp_path / "a" / "*.whl"))
    p = build_wheel(tmp_path / "b", SOLAR_LIBRARY=str(tmp_path / "nope.so"))
    assert p.returncode != 0 and "SOLAR_LIBRARY=" in p.stdout + p.stderr
    p = build_wheel(tmp_path / "c", SOLAR_WHEEL_WITHOUT_LIBRARY="1")
    assert p.returncode == 0, p.stdout + p.stderr
    (pure,) = glob.glob(str(tmp_path / "c" / "*.whl"))
    assert pure.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(pure) as z:
        assert "solar/loader.py" in z.namelist() and "solar/libsolar.so" not in z.namelist()
    assert source_tree_is_clean()


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    d = tmp_path_factory.mktemp("venv") / "v"
    run(PY, "-m", "venv", "--system-site-packages", d)  # Debian's numpy, h5py, torch
    run(d / "bin" / "python", "-m", "pip", "install", wheel, env=user_env())
    return d


def parse_log(path):
    """(header fields, {step: (epoch, label dtype, data sha1, labels sha1, indices)}, params)"""
    with open(path) as f:
        lines = [line.split() for line in f]
    header, steps, params = {}, {}, None
    for row in lines:
        if row[0] == "library":
            header = dict(zip(row[0::2], row[1::2]))
        elif row[0] == "params":
            params = row[1]
        else:
            steps[int(row[0])] = (int(row[1]), row[2], row[3], row[4], row[5:])
    return header, steps, params


def test_ddp_script_from_the_wheel_resumes_mid_epoch(venv, dataset, tmp_path):
    job = tmp_path / "job"  # the user's directory, outside the checkout
    job.mkdir()
    assert not str(job).startswith(REPO)
    script = job / "train_ddp.py"
    shutil.copy(EXAMPLE, script)
    python = venv / "bin" / "python"

    def solar_run(name, *script_args, run_args=()):
        logs = job / name
        logs.mkdir()
        tmp = job / f"{name}.tmp"
        tmp.mkdir()
        p = run(SOLAR, "run", "--nodes", 2, "--ranks-per-node", 1, "--dataset", dataset,
                "--epochs", 2, "--batch", 8, "--buffer", "40%", *run_args, "--", python, script,
                "--log", logs, "--checkpoint", job / "ckpt.pt", *script_args,
                env=user_env(TMPDIR=str(tmp)), cwd=job, check=False)
        out = p.stdout + p.stderr
        assert p.returncode == 0, out
        assert "continuing from step" not in out, out  # no rank fell back to direct reads
        assert os.listdir(tmp) == []
        return out, {r: parse_log(logs / f"rank-{r}.txt") for r in (0, 1)}

    out, full = solar_run("full")
    assert out.count("done, from the node agent") == 2, out
    for rank, (header, steps, params) in full.items():
        # The wheel's own libsolar, found beside the package.
        assert header["library"] == str(venv / "lib" / f"python{sysconfig.get_python_version()}"
                                        / "site-packages" / "solar" / "libsolar.so"), header
        assert header["agent"] == "1" and header["batch_size"] == "8"
        assert {dtype for _, dtype, *_ in steps.values()} == {"torch.int64"}
        assert params is not None
    total = len(full[0][1])
    spe = total // 2
    stop = spe + spe // 2  # mid-epoch 1
    assert 0 < stop % spe and stop < total - 1
    assert full[0][2] == full[1][2]  # DDP: one model

    out, first = solar_run("first", "--stop-after-step", stop)
    assert out.count(f"checkpoint after step {stop}, stopping") == 2, out
    assert (job / "ckpt.pt").exists()
    for rank in (0, 1):
        assert first[rank][1] == {s: v for s, v in full[rank][1].items() if s <= stop}

    for name, run_args in (("resumed", ()), ("resumed-direct", ("--no-agent",))):
        out, resumed = solar_run(name, run_args=run_args)
        assert out.count("done, " + ("read directly" if run_args else "from the node agent")) \
            == 2, out
        for rank in (0, 1):
            header, steps, params = resumed[rank]
            assert header["agent"] == ("0" if run_args else "1"), name
            assert min(steps) == stop + 1, name
            assert steps == {s: v for s, v in full[rank][1].items() if s > stop}, name
            assert params == full[rank][2], name  # the same training, step for step

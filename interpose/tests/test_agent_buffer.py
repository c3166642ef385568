"""The attached path, against the stand-in agent (conftest.StandInAgent; no real agent answers
SOLAR_OP_XHELLO yet). Its buffer holds the file's true bytes for the even samples only, so an
unmodified h5py + DataLoader job mixes served samples, file reads, and short reads (span 3),
and must still see exactly the batches it sees without the preload."""
import pytest

from conftest import (HERE, N, PYTHON, S, StandInAgent, file_sample, plain_env, preload_env,
                      run)

LOADER = str(HERE / "loader.py")
EPOCHS = 2


def even(k):
    return k % 2 == 0


@pytest.fixture(scope="module")
def baseline(h5file):
    dataset, _ = h5file
    out = {}
    for span in (1, 3):
        r = run([PYTHON, LOADER, str(dataset), "0", "init", str(span), str(EPOCHS)], plain_env())
        assert r.returncode == 0, r.stderr.decode()[-2000:]
        out[span] = r
    return out


@pytest.mark.parametrize("span", [1, 3])
@pytest.mark.parametrize("workers,mode", [(0, "init"), (2, "init"), (2, "lazy")])
def test_served_batches_identical(lib, h5file, baseline, tmp_path, workers, mode, span):
    dataset, offset = h5file
    sock = tmp_path / "agent.sock"
    agent = StandInAgent(sock, dataset, offset, even,
                         lambda k: file_sample(dataset, offset, k))
    try:
        r = run([PYTHON, LOADER, str(dataset), str(workers), mode, str(span), str(EPOCHS)],
                preload_env(lib, dataset, sock))
        stats, consumed, hellos = agent.stats(), agent.consumed(), list(agent.hellos)
    finally:
        agent.close()
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert r.stdout == baseline[span].stdout
    assert r.stderr == baseline[span].stderr
    # Lazy opens happen in the workers only (new ones each epoch): each attaches. Otherwise
    # the main process attaches and the workers inherit its mapping.
    attaching = workers * EPOCHS if mode == "lazy" else 1
    assert stats["attached"] == attaching == len(hellos)
    assert all(h[:4] == (0x524C4F53, 1, 11, 8) and h[4] > 0 for h in hellos)
    assert stats["torn"] == 0
    if span == 1:  # one pread per row at its start
        reads = EPOCHS * N
        assert stats["hit_reads"] == reads // 2 and stats["hit_bytes"] == reads // 2 * S
        assert stats["miss_reads"] == reads // 2 and stats["miss_bytes"] == reads // 2 * S
        assert consumed == [EPOCHS] * N
    else:  # a 3-row read is served up to its first odd row, then HDF5 reads the rest
        assert stats["hit_reads"] > 0 and stats["miss_reads"] > 0
        assert stats["hit_bytes"] + stats["miss_bytes"] >= EPOCHS * (N - 2) * 3 * S


def test_replaced_file_is_read_directly(lib, h5file, baseline, tmp_path):
    dataset, offset = h5file
    sock = tmp_path / "agent.sock"
    agent = StandInAgent(sock, dataset, offset, even, lambda k: b"\0" * S, file_size_delta=1)
    try:
        r = run([PYTHON, LOADER, str(dataset), "0", "init", "1", str(EPOCHS)],
                preload_env(lib, dataset, sock))
        stats = agent.stats()
    finally:
        agent.close()
    assert r.returncode == 0
    assert r.stdout == baseline[1].stdout
    warning = f"solar: {dataset} is not the file the node agent holds; reading it directly\n"
    assert r.stderr == warning.encode() + baseline[1].stderr
    assert stats == dict.fromkeys(stats, 0)


def test_error_reply_is_read_directly_and_silently(lib, h5file, baseline, tmp_path):
    dataset, offset = h5file
    sock = tmp_path / "agent.sock"
    agent = StandInAgent(sock, dataset, offset, even, lambda k: b"\0" * S, error_reply=True)
    try:
        r = run([PYTHON, LOADER, str(dataset), "2", "lazy", "1", str(EPOCHS)],
                preload_env(lib, dataset, sock))
        stats, hellos = agent.stats(), len(agent.hellos)
    finally:
        agent.close()
    assert r.returncode == 0
    assert r.stdout == baseline[1].stdout and r.stderr == baseline[1].stderr
    assert hellos == 2 * EPOCHS and stats == dict.fromkeys(stats, 0)  # one per worker


@pytest.mark.parametrize("dataset_var,socket_set",
                         [("fabric://node1/train.h5:/data", True), (None, False), ("", True)])
def test_inert_configurations_never_connect(lib, h5file, baseline, tmp_path, dataset_var,
                                            socket_set):
    dataset, offset = h5file
    sock = tmp_path / "agent.sock"
    agent = StandInAgent(sock, dataset, offset, even, lambda k: b"\0" * S)
    env = preload_env(lib, dataset, sock, verbose=True)
    if dataset_var is not None:
        env["SOLAR_DATASET"] = dataset_var
    if not socket_set:
        del env["SOLAR_SOCKET"]
    try:
        r = run([PYTHON, LOADER, str(dataset), "0", "init", "1", str(EPOCHS)], env)
        hellos = len(agent.hellos)
    finally:
        agent.close()
    assert r.returncode == 0
    assert r.stdout == baseline[1].stdout and r.stderr == baseline[1].stderr
    assert hellos == 0

"""solar.Loader in this process, reading directly (no agent): content, order, configuration,
errors, batch lifetime, epochs."""
import csv
import io
import os
from collections import defaultdict

import numpy as np
import pytest

import solar
from conftest import SAMPLES, SEED, SOLAR, make_plan, run
from content import expected


def plan_sequences(plan):
    """rank -> global step -> samples, from solar plan-dump."""
    seq = defaultdict(dict)
    for r in csv.DictReader(io.StringIO(run(SOLAR, "plan-dump", plan).stdout)):
        seq[int(r["rank"])].setdefault(int(r["global_step"]), []).append(int(r["sample"]))
    return seq


def open_direct(plan, dataset, rank=0, **kw):
    return solar.Loader(plan=plan, node=0, local_rank=rank, dataset=dataset, socket="", **kw)


def test_every_sample_read_directly_in_plan_order(plan, dataset, clean_env):
    seq = plan_sequences(plan)
    seen = defaultdict(set)
    for rank in (0, 1):
        with open_direct(plan, dataset, rank) as loader:
            assert not loader.using_agent
            assert (loader.rank, loader.world_size, loader.epochs) == (rank, 2, 2)
            assert loader.shape == (4, 8, 8, 8) and loader.dtype == np.int16
            assert loader.label_dtype == np.int32
            got = {}
            for epoch in range(loader.epochs):
                loader.set_epoch(epoch)
                n = 0
                for batch in loader:
                    n += 1
                    data, labels = batch
                    assert data.shape == (len(batch),) + loader.shape
                    assert batch.epoch == epoch
                    got[batch.step] = list(batch.indices)
                    for k, idx in enumerate(batch.indices):
                        raw, label = expected(SEED, int(idx), loader.sample_bytes)
                        assert data[k].tobytes() == raw, f"sample {idx}"
                        assert int(labels[k]) == label
                        seen[epoch].add(int(idx))
                assert n == len(loader)
        assert got == seq[rank]
    assert all(seen[e] == set(range(SAMPLES)) for e in (0, 1))


def test_environment_configuration_and_arguments(plan, dataset, clean_env):
    with pytest.raises(solar.SolarError, match="SOLAR_PLAN is not set"):
        solar.Loader()
    clean_env.setenv("SOLAR_PLAN", plan)
    clean_env.setenv("SOLAR_NODE", "0")
    clean_env.setenv("LOCAL_RANK", "1")
    clean_env.setenv("SOLAR_DATASET", dataset)
    with solar.Loader() as loader:
        assert loader.rank == 1 and loader.samples == SAMPLES
    # Explicit arguments win and leave the environment as it was.
    with solar.Loader(local_rank=0) as loader:
        assert loader.rank == 0
    assert os.environ["LOCAL_RANK"] == "1" and "SOLAR_LOCAL_RANK" not in os.environ


def test_bad_arguments_raise_clear_exceptions(workdir, plan, dataset, clean_env):
    with pytest.raises(solar.SolarError, match="SOLAR_NODE=3 but the plan"):
        solar.Loader(plan=plan, node=3, local_rank=0, dataset=dataset)
    with pytest.raises(solar.SolarError, match="SOLAR_LOCAL_RANK=2 but the plan has 2"):
        open_direct(plan, dataset, rank=2)
    with pytest.raises(TypeError, match="local_rank must be an int"):
        open_direct(plan, dataset, rank="0")
    with pytest.raises(ValueError, match="node=-1 is out of range"):
        solar.Loader(plan=plan, node=-1, local_rank=0, dataset=dataset)
    with pytest.raises(FileNotFoundError, match="plan file .*nope does not exist"):
        open_direct(os.path.join(workdir, "nope"), dataset)
    with pytest.raises(solar.SolarError, match="missing.h5"):
        open_direct(plan, os.path.join(workdir, "missing.h5"))
    other = make_plan(workdir, "p-other", "--epochs", 1, "--nodes", 1, "--ranks-per-node", 1,
                      "--batch", 4, "--buffer", "10%", sample_bytes=8192)
    with pytest.raises(solar.SolarError, match="the plan expects"):
        open_direct(other, dataset)
    not_a_plan = os.path.join(workdir, "garbage.plan")
    with open(not_a_plan, "wb") as f:
        f.write(b"not a plan" * 10)
    with pytest.raises(solar.SolarError, match="garbage.plan"):
        open_direct(not_a_plan, dataset)
    with pytest.raises(ValueError, match="a sample is 4096"):
        open_direct(plan, dataset, shape=(3, 3))
    with pytest.raises(ValueError, match="label dtype int64 is 8 bytes"):
        open_direct(plan, dataset, label_dtype="int64")


def test_batch_used_after_release_raises(plan, dataset, clean_env):
    with open_direct(plan, dataset) as loader:
        first = loader.next_batch()
        view = first.sample(0)
        raw, _ = expected(SEED, int(first.indices[0]), loader.sample_bytes)
        assert view.tobytes() == raw and not view.flags.writeable
        kept = first.data  # a copy: stays valid
        first.release()
        first.release()  # idempotent
        for use in (lambda: first.data, lambda: first.labels, lambda: first.sample(0),
                    lambda: first.views(), lambda: list(first)):
            with pytest.raises(solar.BatchReleasedError, match="after it was released"):
                use()
        assert first.step == 0 and len(first) == 8  # metadata stays
        second = loader.next_batch()
        assert kept[0].tobytes() == raw
        third = loader.next_batch()  # taking the next batch releases the previous one
        with pytest.raises(solar.BatchReleasedError):
            second.data
        assert third.step == 2
    with pytest.raises(solar.BatchReleasedError):
        third.sample(0)  # closing the loader released it too
    with pytest.raises(solar.SolarError, match="closed"):
        loader.next_batch()


def test_batch_copies_are_recycled_only_once_dropped(plan, dataset, clean_env):
    """`data` comes from a pool: a block is reused after its array (and every view of it) is
    gone, never while anything still refers to it."""
    import gc
    import solar._lib as L
    with open_direct(plan, dataset) as loader:
        held = []
        for _ in range(6):  # every copy held: no two share memory, all stay correct
            b = loader.next_batch()
            held.append((b.indices.copy(), b.data, b.data[1:3]))
        for indices, data, part in held:
            for k, idx in enumerate(indices):
                assert data[k].tobytes() == expected(SEED, int(idx), loader.sample_bytes)[0]
            assert part.base is not None and np.shares_memory(part, data)
        assert not any(np.shares_memory(held[i][1], held[j][1])
                       for i in range(6) for j in range(i + 1, 6))
        addr = held[-1][1].ctypes.data
        view_only = held[-1][2]
        del indices, data, part, b
        held.clear()
        gc.collect()
        b = loader.next_batch()
        assert b.data.ctypes.data != addr  # a view of that block is still alive
        assert addr not in [blk.ctypes.data for blk in loader._pool.free]
        del view_only
        gc.collect()
        assert loader._pool.free[-1].ctypes.data == addr  # back in the pool, reused next
        b = loader.next_batch()
        # The one-call copy names a buffer that is too small.
        buf = np.empty(loader.sample_bytes, np.uint8)
        assert L.lib.solar_batch_gather(b._handle, buf.ctypes.data, buf.nbytes, None, 0) == -1
        assert "the data buffer has" in L.last_error()


def test_epochs_run_forward(plan, dataset, clean_env):
    with open_direct(plan, dataset) as loader:
        assert len(loader) == loader.steps_per_epoch
        for batch in loader:  # epoch 0, abandoned half way
            if batch.step == 3:
                break
        assert batch.released
        with pytest.warns(UserWarning, match="skipping"):
            loader.set_epoch(1)
            steps = [b.step for b in loader]
        assert steps == list(range(len(loader), 2 * len(loader)))
        with pytest.raises(ValueError, match="epochs run forward only"):
            loader.set_epoch(0)
        with pytest.raises(ValueError, match="outside the plan's 0..1"):
            loader.set_epoch(2)
        with pytest.raises(solar.SolarError, match="all 2 epochs"):
            next(iter(loader))
        assert loader.next_batch() is None


def test_weights_are_one_without_imbalance(plan, dataset, clean_env):
    with open_direct(plan, dataset) as loader:
        assert {b.weight for b in loader} == {1.0}


def test_torch_copy_and_zero_copy(plan, dataset, clean_env):
    torch = pytest.importorskip("torch")
    import solar.torch
    with pytest.warns(UserWarning, match="CUDA is not available"):
        loader = solar.torch.Loader(plan=plan, node=0, local_rank=1, dataset=dataset, socket="",
                                    pin_memory=True)
    with loader:
        for batch in loader:
            x, y = batch
            assert x.dtype == torch.int16 and y.dtype == torch.int32
            assert tuple(x.shape) == (len(batch), 4, 8, 8, 8)
            for k, idx in enumerate(batch.indices):
                raw, label = expected(SEED, int(idx), loader.sample_bytes)
                assert x[k].numpy().tobytes() == raw and int(y[k]) == label
                v = batch.sample(k)  # zero copy: the tensor is the library's memory
                assert v.data_ptr() == batch._ptrs[k] and v.numpy().tobytes() == raw
            last = batch
        with pytest.raises(solar.BatchReleasedError):
            last.sample(0)
        assert x.sum() == x.sum()  # the copy outlives its batch
    with pytest.raises(TypeError, match="uint16 has no torch equivalent"):
        solar.torch.Loader(plan=plan, node=0, local_rank=0, dataset=dataset, socket="",
                           dtype="uint16")


def test_library_is_found():
    assert os.path.exists(solar.library_path)

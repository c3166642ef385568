# SPDX-License-Identifier: Apache-2.0
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
            assert loader.label_dtype == np.int64  # class indices, as torch's losses take
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
    with pytest.raises(TypeError, match="transform must be callable"):
        open_direct(plan, dataset, transform="x")


def test_batch_used_after_release_raises(plan, dataset, clean_env):
    """Copies (data, labels) stay valid; zero-copy views raise once the batch is released, and
    the error says what released it."""
    with open_direct(plan, dataset) as loader:
        first = loader.next_batch()
        view = first.sample(0)
        raw, _ = expected(SEED, int(first.indices[0]), loader.sample_bytes)
        assert view.tobytes() == raw and not view.flags.writeable
        first.release()
        first.release()  # idempotent
        x, y = first  # copied when taken: still valid
        assert x[0].tobytes() == raw and first.data is x
        for use in (lambda: first.sample(0), lambda: first.views()):
            with pytest.raises(solar.BatchReleasedError, match="after it was released by "
                               r"release\(\): zero-copy views are valid only while"):
                use()
        assert first.step == 0 and len(first) == 8  # metadata stays
        second = loader.next_batch()
        third = loader.next_batch()  # taking the next batch releases the previous one
        with pytest.raises(solar.BatchReleasedError,
                           match=r"step 1 after it was released when the next batch \(step 2\)"):
            second.sample(0)
        assert second.data[0].tobytes() == expected(SEED, int(second.indices[0]),
                                                    loader.sample_bytes)[0]
        assert third.step == 2
    with pytest.raises(solar.BatchReleasedError, match="when the loader was closed"):
        third.sample(0)  # closing the loader released it too
    with pytest.raises(solar.SolarError, match="closed"):
        loader.next_batch()


def test_zero_copy_mode_copies_on_first_use_only_while_held(plan, dataset, clean_env):
    with open_direct(plan, dataset, zero_copy=True) as loader:
        first = loader.next_batch()
        assert first._data is None  # nothing copied yet
        kept = first.data
        second = loader.next_batch()
        assert kept[0].tobytes() == expected(SEED, int(first.indices[0]), loader.sample_bytes)[0]
        x, y = first  # read before release: still there
        assert x is kept and y.dtype == np.int64
        loader.next_batch()
        for use in (lambda: second.data, lambda: second.labels, lambda: list(second)):
            with pytest.raises(solar.BatchReleasedError,
                               match=r"the loader has zero_copy=True.*before the next batch"):
                use()


def test_next_iter_gives_a_usable_batch(plan, dataset, clean_env):
    """The PyTorch habit: peek at one batch, unpack it, keep it until the next one."""
    for zero_copy in (False, True):
        with open_direct(plan, dataset, zero_copy=zero_copy) as loader:
            b = next(iter(loader))
            x, y = b
            assert not b.released and b.step == 0
            assert x.shape == (8,) + loader.shape and y.dtype == np.int64
            for k, idx in enumerate(b.indices):
                raw, label = expected(SEED, int(idx), loader.sample_bytes)
                assert x[k].tobytes() == raw and int(y[k]) == label
                assert b.sample(k).tobytes() == raw  # held: views too
            # Epoch 0 again, as after a DataLoader peek: the peeked batch first, then the rest.
            loader.set_epoch(0)
            again = list(loader)
            assert again[0] is b and [x.step for x in again] == list(range(len(loader)))
            # A whole epoch collected in a list stays valid (copies), as with a DataLoader.
            loader.set_epoch(1)
            batches = list(loader)
            assert b.released
            if not zero_copy:
                for batch in batches:
                    data, labels = batch
                    for k, idx in enumerate(batch.indices):
                        raw, label = expected(SEED, int(idx), loader.sample_bytes)
                        assert data[k].tobytes() == raw and int(labels[k]) == label


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
        assert not batch.released  # held until the next batch is taken
        with pytest.warns(UserWarning, match="skipping"):
            loader.set_epoch(1)
            steps = [b.step for b in loader]
        assert batch.released
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
            assert x.dtype == torch.int16 and y.dtype == torch.int64
            assert tuple(x.shape) == (len(batch), 4, 8, 8, 8)
            for k, idx in enumerate(batch.indices):
                raw, label = expected(SEED, int(idx), loader.sample_bytes)
                assert x[k].numpy().tobytes() == raw and int(y[k]) == label
                v = batch.sample(k)  # zero copy: the tensor is the library's memory
                assert v.data_ptr() == batch._ptrs[k] and v.numpy().tobytes() == raw
            last = batch
        assert not last.released  # the epoch's last batch is held until the next is taken
    with pytest.raises(solar.BatchReleasedError):
        last.sample(0)
    assert x.sum() == x.sum()  # the copy outlives its batch
    with pytest.raises(TypeError, match="uint16 has no torch equivalent"):
        solar.torch.Loader(plan=plan, node=0, local_rank=0, dataset=dataset, socket="",
                           dtype="uint16")


def test_library_is_found():
    assert os.path.exists(solar.library_path)


def test_labels_are_int64_unless_asked_otherwise(plan, dataset, clean_env):
    torch = pytest.importorskip("torch")
    import solar.torch
    with open_direct(plan, dataset, label_dtype="int32") as loader:
        x, y = next(iter(loader))
        assert y.dtype == np.int32 and loader.label_dtype == np.int32
        assert [int(v) for v in y] == [expected(SEED, int(i), loader.sample_bytes)[1]
                                       for i in next(iter([loader._held.indices]))]
    with open_direct(plan, dataset, label_dtype=np.float64) as loader:
        assert next(iter(loader)).labels.dtype == np.float64
    kw = dict(plan=plan, node=0, local_rank=0, dataset=dataset, socket="")
    with solar.torch.Loader(**kw) as loader:
        x, y = next(iter(loader))
        assert y.dtype == torch.int64
        # What a classification loss takes without a cast.
        torch.nn.functional.cross_entropy(torch.zeros(len(y), 2), y % 2)
    with solar.torch.Loader(label_dtype=torch.int32, **kw) as loader:
        assert next(iter(loader)).labels.dtype == torch.int32


def test_transform_batch_size_and_dataset_attributes(plan, dataset, clean_env):
    calls = []

    def transform(data, labels):
        calls.append((data.shape, labels.dtype))
        return data.astype(np.float32) / 2, labels + 1

    with open_direct(plan, dataset, transform=transform) as loader:
        assert loader.batch_size == 8  # per rank, like DataLoader.batch_size
        assert len(loader.dataset) == SAMPLES and str(loader.dataset) == dataset
        assert loader.dataset.file == dataset and loader.dataset.name == "/data"
        assert loader.dataset.labels == "/label"
        assert loader.dataset.shape == (4, 8, 8, 8) and loader.dataset.dtype == np.int16
        for batch in loader:
            x, y = batch
            assert x.dtype == np.float32 and batch.data is x and batch.labels is y
            for k, idx in enumerate(batch.indices):
                raw, label = expected(SEED, int(idx), loader.sample_bytes)
                want = np.frombuffer(raw, np.int16).astype(np.float32) / 2
                assert np.array_equal(x[k].ravel(), want) and int(y[k]) == label + 1
            if batch.step == 2:
                break
        assert calls == [((8, 4, 8, 8, 8), np.int64)] * 3  # once per batch
    with open_direct(plan, dataset, transform=lambda d, l: d) as loader:
        with pytest.raises(TypeError, match=r"transform must return \(data, labels\)"):
            next(iter(loader))


def run_from(loader, start_epoch=0):
    """step -> (indices, data bytes, labels) of every batch the loop sees from start_epoch."""
    got = {}
    for epoch in range(start_epoch, loader.epochs):
        loader.set_epoch(epoch)
        for x, y in (b for b in loader):
            b = loader._held
            got[b.step] = (list(b.indices), x.tobytes(), list(y))
    return got


def test_state_dict_resumes_mid_epoch_with_identical_batches(plan, dataset, clean_env):
    import json
    with open_direct(plan, dataset) as loader:
        full = run_from(loader)
        spe, total = loader.steps_per_epoch, loader.steps_per_epoch * loader.epochs
    assert sorted(full) == list(range(total))
    for stop in (0, 3, spe - 1, spe, spe + 2, total - 1):  # state taken while batch `stop` is held
        with open_direct(plan, dataset) as a:
            state = None
            for epoch in range(a.epochs):
                a.set_epoch(epoch)
                for b in a:
                    if b.step == stop:
                        state = a.state_dict()
                        break
                if state:
                    break
        assert state["step"] == stop + 1 and state["epoch"] == (stop + 1) // spe
        state = json.loads(json.dumps(state))  # plain values: torch.save, json
        with open_direct(plan, dataset, rank=1) as b:  # any rank's state fits every rank
            b.load_state_dict(state)
        with open_direct(plan, dataset) as b:
            b.load_state_dict(state)
            # The user's loop resumes at the saved epoch (stop // spe), not the next one.
            rest = run_from(b, start_epoch=stop // spe)
        assert sorted(rest) == list(range(stop + 1, total)), stop
        assert all(rest[s] == full[s] for s in rest), stop
    # The saved epoch's remainder without set_epoch: iteration continues it too.
    with open_direct(plan, dataset) as b:
        b.load_state_dict(dict(state, step=5, epoch=0))
        assert [x.step for x in b] == list(range(5, spe))


def test_load_state_dict_refuses_another_plan(workdir, plan, dataset, clean_env):
    with open_direct(plan, dataset) as loader:
        state = loader.state_dict()
    assert state["plan"] == loader.plan_fingerprint and state["world_size"] == 2
    other_seed = make_plan(workdir, "p-seed", "--epochs", 2, "--nodes", 1, "--ranks-per-node", 2,
                           "--batch", 8, "--buffer", "50%", "--seed", 99)
    more_epochs = make_plan(workdir, "p-epochs", "--epochs", 3, "--nodes", 1,
                            "--ranks-per-node", 2, "--batch", 8, "--buffer", "50%")
    with open_direct(other_seed, dataset) as other:
        with pytest.raises(ValueError, match="another plan .*plan fingerprint .*another seed"):
            other.load_state_dict(dict(state, step=3))
        with pytest.warns(UserWarning, match="continuing at its step"):
            other.load_state_dict(dict(state, step=3), strict=False)
        assert next(iter(other)).step == 3
    with open_direct(more_epochs, dataset) as other:
        with pytest.raises(ValueError, match="epochs 2 in the state, 3 here"):
            other.load_state_dict(state)
    with open_direct(plan, dataset) as loader:
        total = loader.epochs * loader.steps_per_epoch
        with pytest.raises(ValueError, match=f"step {total + 1} is beyond the end of the plan "
                                             f"\\({total} steps"):
            loader.load_state_dict(dict(state, step=total + 1))
        with pytest.raises(ValueError, match="not a solar.Loader state"):
            loader.load_state_dict({"step": 1})
        with pytest.raises(TypeError, match="expected a dict"):
            loader.load_state_dict([("step", 1)])
        loader.load_state_dict(dict(state, step=total))  # at the very end: nothing left
        assert loader.next_batch() is None
    with open_direct(plan, dataset) as loader:
        for _ in range(4):
            loader.next_batch()
        with pytest.raises(ValueError, match="already at step 4, past the state's step 2"):
            loader.load_state_dict(dict(state, step=2))


def test_standalone_process_is_node_0_local_rank_0(workdir, dataset, clean_env):
    solo = make_plan(workdir, "p-solo", "--epochs", 1, "--batch", 8, "--buffer", "50%")
    # No launcher, no SOLAR_NODE / LOCAL_RANK: rank 0 of a one-rank plan.
    with solar.Loader(plan=solo, dataset=dataset) as loader:
        assert (loader.rank, loader.world_size) == (0, 1)
        assert len(list(loader)) == len(loader)
    with pytest.raises(solar.SolarError, match=r"SOLAR_PLAN is not set.*solar plan.*"
                                               r"\(or pass plan= to solar.Loader\)"):
        solar.Loader(dataset=dataset)
    with pytest.raises(solar.SolarError, match=r"SOLAR_DATASET is not set.*"
                                               r"\(or pass dataset= to solar.Loader\)"):
        solar.Loader(plan=solo)
    # One of several processes of a launcher, on a plan of several ranks: it must say which.
    clean_env.setenv("WORLD_SIZE", "2")
    two = make_plan(workdir, "p-two", "--epochs", 1, "--ranks-per-node", 2, "--batch", 8,
                    "--buffer", "50%")
    with pytest.raises(solar.SolarError, match=r"SOLAR_LOCAL_RANK \(or LOCAL_RANK\) is not set "
                                               r"but this process is one of several"):
        solar.Loader(plan=two, dataset=dataset)


def test_peek_then_iterate_replays_it_once_a_second_batch_is_refused(plan, dataset, clean_env):
    """A plain re-iteration after `next(iter(loader))` starts with the peeked batch (same order
    as a DataLoader's new pass); after two batches, epoch 0 cannot start again."""
    with open_direct(plan, dataset) as loader:
        peek = next(iter(loader))
        steps = [b.step for b in loader]  # no set_epoch: the same epoch, from the peek
        assert steps == list(range(len(loader))) and peek.step == 0
        it = iter(loader)
        first, second = next(it), next(it)
        assert (first.step, second.step) == (len(loader), len(loader) + 1)
        with pytest.raises(ValueError, match="epoch 1 has already been served"):
            loader.set_epoch(1)


def test_an_iteration_left_half_way_is_not_silently_skipped(plan, dataset, clean_env):
    with open_direct(plan, dataset) as loader:
        for batch in loader:
            if batch.step == 3:
                break
        with pytest.raises(solar.SolarError,
                           match=r"epoch 0 stopped after 4 of \d+ batches.*set_epoch\(1\)"):
            next(iter(loader))
        assert loader.next_batch().step == 4  # nothing was skipped or lost
        loader.set_epoch(1)  # said: the rest of epoch 0 goes
        with pytest.warns(UserWarning, match="skipping"):
            assert next(iter(loader)).step == len(loader)


def test_dataloader_arguments_accepted_or_refused_naming_the_flag(plan, dataset, clean_env):
    with open_direct(plan, dataset, batch_size=8, shuffle=True, num_workers=4,
                     persistent_workers=True, prefetch_factor=2) as loader:
        assert loader.batch_size == 8
    with pytest.raises(ValueError, match=r"batch_size=16, but the plan's batch per rank is 8.*"
                                         r"solar run --batch, srun --solar-batch"):
        open_direct(plan, dataset, batch_size=16)
    with pytest.raises(ValueError, match="shuffle=False"):
        open_direct(plan, dataset, shuffle=False)
    for kw, says in (({"sampler": object()}, "--order"), ({"collate_fn": len}, "transform="),
                     ({"drop_last": True}, "--drop-last"), ({"generator": None}, "--seed"),
                     ({"worker_init_fn": len}, "no worker processes")):
        with pytest.raises(TypeError, match=f"{next(iter(kw))}= is not taken: .*{says}"):
            open_direct(plan, dataset, **kw)
    with pytest.raises(TypeError, match="unexpected argument bogus="):
        open_direct(plan, dataset, bogus=1)
    with pytest.raises(TypeError, match="dataset= is the dataset's path"):
        solar.Loader(plan=plan, node=0, local_rank=0, dataset=[1, 2], socket="")


def test_sampler_set_epoch_and_signatures(plan, dataset, clean_env):
    import inspect
    import solar.torch
    with open_direct(plan, dataset) as loader:
        loader.sampler.set_epoch(1)  # the DistributedSampler habit
        assert loader.epoch == 1 and loader.sampler.epoch == 1
        assert len(loader.sampler) == loader.batch_size * len(loader)
        assert (loader.sampler.rank, loader.sampler.num_replicas) == (0, 2)
        with pytest.warns(UserWarning, match="skipping"):
            assert next(iter(loader)).epoch == 1
    params = inspect.signature(solar.torch.Loader).parameters
    for name in ("plan", "dataset", "transform", "zero_copy", "pin_memory", "device",
                 "batch_size", "shuffle"):
        assert name in params, list(params)
    assert params["pin_memory"].annotation == "bool"
    assert os.path.isfile(os.path.join(os.path.dirname(solar.__file__), "py.typed"))

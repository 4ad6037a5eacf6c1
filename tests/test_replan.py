"""loader.on_failure=replan: workers that die of a resource are replaced by a smaller plan
that continues from the exact batch, with real workers and real signals."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest
from conftest import NARROW_MODEL, run_in_process, run_train
from test_loader_faults import coco640, needs_root, shm_namespace
from test_policy import host

from cocodet.loader.failures.diagnose import LoaderFailure, explained_loader_failures
from cocodet.loader.failures.replan import Replanner, next_rung
from cocodet.loader.flat_batch import chain_stream_digest
from cocodet.loader.plan.policy import plan_loader
from cocodet.loader.plan.records import BatchGeometry, LoaderRequest
from cocodet.loader.plan.resources import probe


def datamodule(root, workers: int, window: int = 0, **replanner_args):
    """A datamodule on the synthetic set (48 train images, batch 4) whose plan has ``workers``
    (inherited: re-plans by default) and a replanner that plans against this host; ``window``:
    window partners (W positions) with the window cache the plan sizes."""
    from cocodet.datamodule import CocoDataModule
    from cocodet.transforms.augment import Mosaic

    def plan_fn(n: int, prefetch: int):
        geometry = BatchGeometry(4, 1 << 20, partner_window=window, image_side=64)
        return plan_loader(LoaderRequest("inherited", n, prefetch), geometry, probe(), cuda=False)

    plan = plan_fn(workers, 2)
    recipe = Mosaic(64, partners="window", partner_window=window) if window else Mosaic(64)
    dm = CocoDataModule(
        root=str(root),
        train_images="train",
        train_ann="annotations/instances_train.json",
        val_images="val",
        val_ann="annotations/instances_val.json",
        image_size=64,
        recipe=recipe,
        batch_size=4,
        seed=0,
        plan=plan,
        replanner=Replanner(plan, plan_fn, **replanner_args),
    )
    dm.setup()
    return dm


def stream(loader, epochs: int, kill_at: int | None = None, sig: signal.Signals = signal.SIGKILL) -> str:
    """Digest of every batch of ``epochs`` epochs; SIGKILL a worker after batch ``kill_at``."""
    digest, k = "", 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            digest = chain_stream_digest(digest, batch)
            if k == kill_at:
                os.kill(loader.worker_pids()[0], sig)
            k += 1
    return digest


def shut_down(loader) -> None:
    with contextlib.suppress(Exception):
        loader._shut_down()


@pytest.mark.parametrize(
    "sig,cause,window", [(signal.SIGKILL, "memory", 0), (signal.SIGBUS, "shm", 0), (signal.SIGKILL, "memory", 8)]
)
def test_killed_worker_is_replaced_and_the_stream_continues_exactly(synthetic_root, sig, cause, window):
    """Window partners too (issue 54): the killed worker may die holding a window-cache claim;
    the stream does not depend on which slots survived."""
    reference = stream(datamodule(synthetic_root, 0, window).train_dataloader(), epochs=2)
    dm = datamodule(synthetic_root, 2, window)
    assert bool(dm.plan.window_slots) == bool(window)
    loader = dm.train_dataloader()
    try:
        digest = stream(loader, epochs=2, kill_at=4, sig=sig)  # mid-epoch 0 (12 batches per epoch)
    finally:
        shut_down(loader)
    assert digest == reference
    assert (dm.window_cache is not None) == bool(window)  # the stream above went through the shared cache
    [record] = dm.replanner.records
    assert record["cause"] == cause and record["stage"] == "train" and record["epoch"] == 0
    assert record["old_workers"] == 2 and record["new_workers"] == 1 and 5 <= record["batch"] <= 8
    assert dm.plan.num_workers == 1 and dm.plan.source == "replan"
    # The val loader, built after the re-plan, loads with the smaller plan.
    assert dm.val_dataloader().num_workers == 1


def test_a_replan_stops_the_other_loaders_workers_and_both_streams_stay_exact(synthetic_root):
    """Train and val persistent workers alive at once: a re-plan of either stops the other's
    workers before probing /dev/shm (their prefetched batches must count as free), and a
    train epoch suspended mid-way (validation inside the epoch) resumes at its next batch."""

    def batches(loader, epoch):
        loader.set_epoch(epoch)
        return iter(loader)

    ref = datamodule(synthetic_root, 0)
    ref_train, ref_val = ref.train_dataloader(), ref.val_dataloader()
    want_val = [chain_stream_digest("", b) for b in batches(ref_val, 0)]
    want_train = [chain_stream_digest("", b) for b in batches(ref_train, 0)]

    dm = datamodule(synthetic_root, 2)
    train, val = dm.train_dataloader(), dm.val_dataloader()
    try:
        sanity = batches(val, 0)  # like Lightning's sanity check: two batches, the rest prefetched
        assert [chain_stream_digest("", next(sanity)) for _ in range(2)] == want_val[:2]
        val_pids = val.worker_pids()
        assert val_pids
        epoch = batches(train, 0)
        got_train = [chain_stream_digest("", next(epoch)) for _ in range(3)]
        os.kill(train.worker_pids()[0], signal.SIGKILL)
        # Batches already in flight still arrive; the death is found when the dead worker's
        # turn comes (how many arrive first depends on timing), and the re-plan happens there.
        while not dm.replanner.records and len(got_train) < len(want_train):
            got_train.append(chain_stream_digest("", next(epoch)))
        assert len(dm.replanner.records) == 1 and val._stream.iterator is None
        for pid in val_pids:  # stopped, not left holding their prefetched batches
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        # Validation in the middle of the train epoch dies too: the suspended train epoch's
        # workers are released by that re-plan and its stream restarts where it stood.
        val_epoch = batches(val, 0)
        got_val2 = [chain_stream_digest("", next(val_epoch))]
        os.kill(val.worker_pids()[0], signal.SIGKILL)
        got_val2 += [chain_stream_digest("", b) for b in val_epoch]
        assert len(dm.replanner.records) == 2 and train._stream.iterator is None
        got_train += [chain_stream_digest("", b) for b in epoch]
    finally:
        shut_down(train)
        shut_down(val)
    assert got_val2 == want_val
    assert got_train == want_train


def test_on_failure_defaults_to_raise_for_explicit_counts_only():
    res = probe()
    explicit = plan_loader(LoaderRequest("explicit", 2, 2), BatchGeometry(4, 1 << 20), res, cuda=False)
    assert Replanner(explicit).on_failure == "raise"
    assert Replanner(explicit, on_failure="replan").on_failure == "replan"
    for policy in ("auto", "inherited"):
        assert (
            Replanner(plan_loader(LoaderRequest(policy, 2, 2), BatchGeometry(4, 1 << 20), res, cuda=False)).on_failure
            == "replan"
        )


def test_on_failure_raise_ends_in_the_diagnosis(synthetic_root):
    dm = datamodule(synthetic_root, 2, on_failure="raise")
    loader = dm.train_dataloader()
    try:
        with pytest.raises(LoaderFailure, match="ended by SIGKILL"):
            with explained_loader_failures(dm.plan):
                stream(loader, epochs=1, kill_at=2)
    finally:
        shut_down(loader)
    assert dm.replanner.records == [] and dm.plan.num_workers == 2


def test_gives_up_after_max_replans(synthetic_root):
    dm = datamodule(synthetic_root, 2, max_replans=0)
    loader = dm.train_dataloader()
    try:
        with pytest.raises(LoaderFailure, match=r"Gave up after loader.max_replans=0 re-plans"):
            stream(loader, epochs=1, kill_at=2)
    finally:
        shut_down(loader)


def test_a_samples_own_exception_is_never_retried():
    plan = plan_loader(LoaderRequest("auto", None, 2), BatchGeometry(4, 1 << 20), probe(), cuda=False)
    replanner = Replanner(plan, lambda n, p: pytest.fail("re-planned a sample's own error"))
    own = RuntimeError(
        "Caught BadSampleError in DataLoader worker process 0.\nOriginal Traceback (most recent call "
        "last):\n  ...\ncocodet.errors.BadSampleError: train2017/x.jpg: cannot decode"
    )
    hang = RuntimeError("DataLoader timed out after 20 seconds")
    segv = RuntimeError("DataLoader worker (pid 7) is killed by signal: Segmentation fault.")
    for error in (own, hang, segv, ValueError("a bug in a recipe")):
        assert replanner.failure(error) is None
    assert replanner.failure(RuntimeError("DataLoader worker (pid 7) is killed by signal: Killed."))[0] == "memory"
    assert replanner.failure(RuntimeError("unable to mmap 336 bytes from file </torch_1>"))[0] == "segments"
    assert replanner.records == []


def test_the_ladder_is_fewer_workers_then_prefetch_one_then_in_process():
    res = host()  # 8 CPUs, ample shm and memory: no cap cuts a rung short
    rungs, plan = [], plan_loader(LoaderRequest("explicit", 8, 4), BatchGeometry(8, 1 << 20), res, cuda=False)
    while (rung := next_rung(plan)) is not None:
        rungs.append(rung)
        plan = plan_loader(LoaderRequest("inherited", rung[0], rung[1]), BatchGeometry(8, 1 << 20), res, cuda=False)
    assert rungs == [(4, 4), (2, 4), (1, 4), (1, 1), (0, 1)]


@pytest.mark.slow
@needs_root
def test_explicit_over_budget_in_64mb_shm_replans_and_keeps_the_stream(coco_tiny, tmp_path):
    # 640 px batches of 64 (75 MiB each) cannot fit a 64 MB /dev/shm at all; the detector
    # resizes to 64 px inside, so the steps are cheap and the data path is the real one.
    args = [
        *coco640(coco_tiny),
        "+model.detector.min_size=64",
        "+model.detector.max_size=64",
        NARROW_MODEL,
        "trainer.max_epochs=2",
        "trainer.enable_progress_bar=false",
    ]
    plain = run_in_process([*args, "loader=explicit", "loader.num_workers=0"], tmp_path / "plain")
    proc, s = run_train(
        [*args, "loader=explicit", "loader.num_workers=4", "loader.on_failure=replan"],
        tmp_path / "replan",
        prefix=shm_namespace(),
        timeout=900,
    )
    assert s["status"] == "completed" and s["steps"] == plain["steps"] == 4
    assert s["stream_digest"] == plain["stream_digest"]
    [first] = s["replans"]  # the smaller plan then holds, validation included
    assert first["cause"] == "shm" and first["stage"] == "train" and first["step"] == 0 and first["batch"] == 0
    assert first["old_workers"] == 4 and 1 <= first["new_workers"] < 4
    assert "64.0 MiB in all" in first["diagnosis"]
    out = proc.stdout + proc.stderr
    assert "loader re-plan 1/3 at step 0 (train epoch 0, batch 0): workers died of shm" in out
    assert "Old plan: 4 workers, prefetch 2, whole batches. New plan: " in out and "/dev/shm ran out" in out


@pytest.mark.slow
def test_sigkilled_worker_in_auto_plan_continues_and_is_recorded(coco_tiny, tmp_path):
    args = [
        "dataset=coco",
        f"dataset.root={coco_tiny}",
        "dataset.image_size=64",
        "loader.batch_size=8",
        NARROW_MODEL,
        "trainer.max_epochs=2",
        "trainer.limit_val_batches=2",
        "trainer.enable_progress_bar=false",
    ]
    plain = run_in_process([*args, "loader=explicit", "loader.num_workers=0"], tmp_path / "plain")
    kill = ["+callbacks.kill._target_=signal_at_step.KillWorkerAtStep", "+callbacks.kill.step=13"]
    s = run_in_process([*args, *kill], tmp_path / "killed")  # it kills a worker, not this process
    assert s["status"] == "completed" and s["steps"] == plain["steps"] == 20
    assert s["plan"]["source"] == "auto" and s["on_failure"] == "replan"
    [record] = s["replans"]
    assert record["cause"] == "memory" and record["stage"] == "train" and record["epoch"] == 1
    assert record["old_workers"] == s["plan"]["num_workers"] and 13 <= record["step"] <= 15
    assert s["stream_digest"] == plain["stream_digest"]

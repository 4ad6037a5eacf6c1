"""Aspect-ratio-grouped train batches (loader.group_aspect_ratio, design §5): the reference's
bins, batches from one bin each drawn from (seed, epoch) alone, every image once per epoch,
the same step count on every rank, and the padding they save measured by mode=bench."""

from __future__ import annotations

import bisect

import numpy as np
import pytest
from conftest import run_in_process

from cocodet.bench.padding import pad_share, sample_sizes
from cocodet.datasets.index import build_index
from cocodet.loader.batch_sampler import EpochBatchSampler
from cocodet.loader.grouped_sampler import GroupedEpochSampler, aspect_bins, aspect_groups
from cocodet.loader.stream_position import ResumeError, StreamPosition

B = 4


@pytest.fixture(scope="module")
def sizes(coco_tiny) -> np.ndarray:
    index = build_index(
        coco_tiny / "train2017", coco_tiny / "annotations" / "instances_train2017.json", keep_empty="reference"
    )
    return np.asarray(index.sizes)


def test_bins_are_the_references(sizes):
    """2k + 1 edges 2**linspace(-1, 1, 2k+1); an image's bin is bisect_right of width/height
    (references/detection/group_by_aspect_ratio.py's _quantize)."""
    edges = aspect_bins(3)
    assert np.allclose(edges, [0.5, 0.63, 0.794, 1.0, 1.26, 1.587, 2.0], atol=1e-3)
    expected = [bisect.bisect_right(edges.tolist(), w / h) for h, w in sizes.tolist()]
    assert aspect_groups(sizes, 3).tolist() == expected
    assert len(set(expected)) >= 4  # coco_tiny spans portrait, square and landscape bins


def rank_batches(sampler, epoch: int) -> list[list[int]]:
    """The batches EpochBatchSampler cuts from the sampler's keys for ``epoch``."""
    sampler.set_epoch(epoch)
    return [[k[1] for k in batch] for batch in EpochBatchSampler(sampler, sampler.batch_size, sampler.batch_size)]


def test_every_image_once_one_bin_per_batch_and_the_same_count_every_epoch(sizes):
    sampler = GroupedEpochSampler(sizes, B, 3, seed=0)
    groups = sampler.groups
    full = int((np.bincount(groups) // B).sum())
    seen = []
    for epoch in range(4):
        batches = rank_batches(sampler, epoch)
        assert sorted(i for b in batches for i in b) == list(range(len(sizes)))  # exactly once
        assert len(batches) == sampler.epoch_batches and sum(map(len, batches)) == len(sampler)
        assert all(len(b) == B for b in batches[:-1])  # only the last may be short
        one_bin = [len(set(groups[b].tolist())) == 1 for b in batches]
        assert all(one_bin[:full]), one_bin  # bins close first; the mixed leftovers come last
        assert len(batches) - full <= -(-int((np.bincount(groups) % B).sum()) // B)
        seen.append(batches)
        assert rank_batches(GroupedEpochSampler(sizes, B, 3, seed=0), epoch) == batches  # (seed, epoch) alone
    assert seen[0] != seen[1]
    assert rank_batches(GroupedEpochSampler(sizes, B, 3, seed=1), 0) != seen[0]


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_run_the_same_steps_and_share_the_epoch(sizes, world):
    """79 images (odd): every rank the same number of batches, each cut on a group (the short
    batch is its rank's last), all images taken, the repeats exactly the padding batches."""
    sizes = sizes[:79]
    ranks = [GroupedEpochSampler(sizes, B, 3, seed=0, rank=r, world_size=world) for r in range(world)]
    batches = [rank_batches(s, 0) for s in ranks]
    assert len({len(b) for b in batches}) == 1
    whole = ranks[0].epoch_batches_of(0)
    padded = [whole[j % len(whole)].tolist() for j in range(len(batches[0]) * world)]
    assert [b for r in range(world) for b in padded[r::world]] == [b for r in batches for b in r]
    taken = [i for r in batches for b in r for i in b]
    assert set(taken) == set(range(79))
    assert len(taken) - 79 == sum(len(b) for b in padded[len(whole) :])
    for r, s in zip(batches, ranks):
        assert sum(map(len, r)) == len(s) and all(len(b) == B for b in r[:-1])


def test_grouping_saves_padding_as_measured(sizes):
    """hflip's 800/1333 sizes, batch 4, 20 epochs: at least 3x less padding than ungrouped
    (issue 40's acceptance; docs/benchmarks.md gives the numbers); the reference's repeats,
    which take some images twice, save a little more."""
    groups_sampler = GroupedEpochSampler(sizes, B, 3, seed=0)
    hw = sample_sizes("hflip", sizes, 0)
    grouped, ungrouped = [], []
    for epoch in range(20):
        order = np.random.default_rng((0, epoch, 2**62)).permutation(len(sizes))
        ungrouped.append(pad_share([order[s : s + B] for s in range(0, len(order), B)], hw))
        grouped.append(pad_share(groups_sampler.epoch_batches_of(epoch), hw))
    assert np.mean(ungrouped) / np.mean(grouped) >= 3.0, (np.mean(ungrouped), np.mean(grouped))


def bench(coco_tiny, tmp_path, *extra) -> dict:
    return run_in_process(
        [
            "mode=bench",
            "dataset=coco",
            f"dataset.root={coco_tiny}",
            "augment=hflip",
            "model=fasterrcnn_mobilenet_v3_large_fpn",
            "+model.detector.min_size=96",
            "+model.detector.max_size=160",
            "loader=explicit",
            "loader.num_workers=0",
            f"loader.batch_size={B}",
            "bench.batches=null",
            "bench.epochs=1",
            "bench.warmup=0",
            "bench.digest_batches=20",
            "bench.decode_probe=0",
            *extra,
        ],
        tmp_path,
    )


def test_bench_measures_batch_padding_and_grouping_is_the_default_with_a_preset(coco_tiny, sizes, tmp_path):
    """mode=bench's batch_pad_share is the padding of the batches the loader built: equal to the
    share computed from the sampler's batches and the model's resize, grouped and not."""
    grouped = bench(coco_tiny, tmp_path / "grouped")
    ungrouped = bench(coco_tiny, tmp_path / "ungrouped", "loader.group_aspect_ratio=null")
    assert grouped["group_aspect_ratio"] == 3 and ungrouped["group_aspect_ratio"] is None
    assert grouped["batch_digest"] != ungrouped["batch_digest"]
    hw = sample_sizes("hflip", sizes, 0, model_sizes=(96, 160))
    order = np.random.default_rng((0, 0, 2**62)).permutation(len(sizes))
    assert ungrouped["batch_pad_share"] == pytest.approx(
        pad_share([order[s : s + B] for s in range(0, len(order), B)], hw), abs=1e-4
    )
    assert grouped["batch_pad_share"] == pytest.approx(
        pad_share(GroupedEpochSampler(sizes, B, 3, seed=0).epoch_batches_of(0), hw), abs=1e-4
    )
    assert grouped["batch_pad_share"] < ungrouped["batch_pad_share"]


def test_mosaic_ignores_grouping_and_the_plan_says_so(synthetic_root, tmp_path):
    from conftest import synthetic_overrides

    s = run_in_process(
        ["mode=plan", *synthetic_overrides(synthetic_root), "augment=mosaic", "loader.group_aspect_ratio=3"], tmp_path
    )
    assert s["group_aspect_ratio"] is None
    assert any("loader.group_aspect_ratio=3 is ignored: mosaic's outputs" in w for w in s["warnings"]), s["warnings"]
    assert (
        run_in_process(["mode=plan", *synthetic_overrides(synthetic_root)], tmp_path / "b")["group_aspect_ratio"]
        is None
    )


def test_a_resume_with_another_grouping_is_refused():
    saved = StreamPosition(8, 0, 1, group_aspect_ratio=3).state_dict()
    with pytest.raises(ResumeError, match="loader.group_aspect_ratio is 3 and this run's is None"):
        StreamPosition(8, 0, 1).load_state_dict(saved)
    older = {k: v for k, v in StreamPosition(8, 0, 1).state_dict().items() if k != "group_aspect_ratio"}
    StreamPosition(8, 0, 1).load_state_dict(older)  # a checkpoint from before grouping: ungrouped


def test_a_bad_factor_is_refused_in_one_line(synthetic_root, tmp_path):
    from conftest import synthetic_overrides

    from cocodet.errors import ConfigError

    with pytest.raises(ConfigError, match="loader.group_aspect_ratio"):
        run_in_process(["mode=plan", *synthetic_overrides(synthetic_root), "loader.group_aspect_ratio=0"], tmp_path)

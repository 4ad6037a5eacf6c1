"""The pure loader policy: one test per branch (design §3)."""

from __future__ import annotations

import dataclasses

import pytest

from cocodet.loader.plan.budget import MAIN_PROCESS_HEADROOM
from cocodet.loader.plan.policy import plan_loader
from cocodet.loader.plan.records import BatchGeometry, LoaderRequest
from cocodet.loader.plan.resources import HostResources
from cocodet.units import MiB

GiB = 1 << 30


def host(**changes) -> HostResources:
    base = HostResources(
        affinity_cpus=8,
        cgroup_cpus=None,
        local_world_size=1,
        usable_cpus=8,
        shm_path="/dev/shm",
        shm_total_bytes=16 * GiB,
        shm_free_bytes=16 * GiB,
        nofile_soft=65536,
        nofile_hard=65536,
        max_map_count=65530,
        memory_available_bytes=64 * GiB,
        memory_source="test",
    )
    return dataclasses.replace(base, **changes)


GEOMETRY = {f.name for f in dataclasses.fields(BatchGeometry)}


def plan(policy="auto", requested=None, batch_size=16, batch_bytes=10 * MiB, prefetch=2, res=None, cuda=False, **kw):
    """plan_loader with the request's and the geometry's fields given by name."""
    geometry = BatchGeometry(batch_size, batch_bytes, **{k: v for k, v in kw.items() if k in GEOMETRY})
    request = LoaderRequest(policy, requested, prefetch, **{k: v for k, v in kw.items() if k not in GEOMETRY})
    return plan_loader(request, geometry, res or host(), cuda=cuda)


def cap(p, name):
    return next(c for c in p.caps if c.name == name)


def test_auto_is_min_cpus_and_batch():
    """The CPU rule is a cap like the others: recorded with its reason, applied when the batch
    would want more workers than this rank has CPUs."""
    small, large = plan(batch_size=4), plan(batch_size=64)
    assert small.num_workers == 4 and not cap(small, "cpu").applied
    assert large.num_workers == 8 and cap(large, "cpu").limit == 8 and "8 usable CPUs" in cap(large, "cpu").reason
    assert large.source == "auto" and [c.name for c in large.caps if c.applied] == ["cpu"]
    assert "cap cpu" in large.table() and "APPLIED" in large.table()


def test_auto_shm_cap_applies_with_reason():
    # Budget 100 MiB: one val worker at prefetch 1 reserved (2 x 10 MiB, with the batch the main
    # process holds), so train gets 80 MiB: (3 x 2 + 1) x 10 MiB. Validation takes the 30 MiB left.
    p = plan(batch_size=64, res=host(shm_free_bytes=200 * MiB))
    assert p.num_workers == 3 and (p.val.num_workers, p.val.prefetch_factor) == (1, 2)
    assert cap(p, "shm").applied and "held by the main process" in cap(p, "shm").reason
    assert p.shm_split == {"budget": 100 * MiB, "train": 70 * MiB, "val": 30 * MiB}
    assert "shm split" in p.table() and "val loader" in p.table()


def test_shm_budget_divided_among_local_ranks():
    p = plan(batch_size=64, res=host(shm_free_bytes=800 * MiB, local_world_size=4, usable_cpus=2))
    assert p.shm_budget_bytes == 100 * MiB and p.num_workers == 2  # CPU bound first
    p = plan(batch_size=64, res=host(shm_free_bytes=360 * MiB, local_world_size=4))
    assert p.num_workers == 1  # 45 MiB - 20 for val leaves (1 x 2 + 1) x 10 MiB


def test_shm_lowers_prefetch_before_dropping_workers():
    # Budget 30 MiB - 7.5 MiB for val (a quarter): 22.5 MiB holds one 10 MiB batch in flight and
    # one in the main process, not two in flight.
    p = plan(batch_size=64, batch_bytes=10 * MiB, res=host(shm_free_bytes=60 * MiB))
    assert (p.num_workers, p.prefetch_factor, p.part_images) == (1, 1, None)
    assert "prefetch lowered to 1" in cap(p, "shm").reason
    assert p.inflight_bytes + p.batch_bytes + p.shm_split["val"] <= p.shm_budget_bytes


def test_batch_larger_than_shm_budget_ships_parts():
    # Docker's default 64 MB /dev/shm, batch 64 at 640 px: one uint8 batch is ~79 MB, the
    # budget ~30 MiB, a quarter of it kept for validation: train workers ship parts (a multiple
    # of the partner pool), one each in flight and one being joined; validation ships parts too.
    p = plan(batch_size=64, batch_bytes=79 * MiB, res=host(shm_free_bytes=64 * 1000 * 1000), partner_pool=8)
    assert p.num_workers >= 1 and p.prefetch_factor == 1 and p.persistent_workers
    assert p.part_images == 8 and p.part_images % 8 == 0
    assert 0 < p.inflight_bytes <= p.shm_budget_bytes
    assert p.inflight_bytes == p.num_workers * p.part_images * 79 * MiB // 64
    assert "parts of 8 images" in cap(p, "shm").reason and "--shm-size" in cap(p, "shm").reason
    assert "parts of 8 images" in p.table()
    assert p.val.num_workers == 1 and p.val.part_images and p.shm_split["train"] + p.shm_split["val"] <= 32_000_000
    without_pool = plan(batch_size=64, batch_bytes=79 * MiB, res=host(shm_free_bytes=64 * 1000 * 1000))
    assert without_pool.part_images * without_pool.num_workers * 79 * MiB // 64 <= without_pool.shm_budget_bytes


def test_not_even_one_image_fits_loads_in_main_process():
    p = plan(batch_size=4, batch_bytes=40 * MiB, res=host(shm_free_bytes=8 * MiB))  # 10 MiB images, 4 MiB budget
    assert p.num_workers == 0 and p.prefetch_factor is None and not p.persistent_workers
    assert p.inflight_bytes == 0 and p.part_images is None
    assert "--shm-size" in cap(p, "shm").reason
    assert p.dataloader_kwargs() == {"num_workers": 0, "pin_memory": False}


def test_requested_parts_count_against_the_budget():
    # Both loaders: 2 x (2 x 2 + 1) x 8 MiB = 80 MiB within the 100 MiB budget.
    p = plan("explicit", 2, batch_size=64, batch_bytes=64 * MiB, res=host(shm_free_bytes=200 * MiB), part_images=8)
    assert p.part_images == 8 and p.val.part_images == 8 and p.inflight_bytes == 2 * 2 * 8 * MiB and not p.warnings
    p = plan("explicit", 2, batch_size=64, batch_bytes=64 * MiB, res=host(shm_free_bytes=200 * MiB))
    assert any("loader.part_images=" in w for w in p.warnings)


def test_memory_cap_budgets_the_larger_val_batch():
    room = MAIN_PROCESS_HEADROOM + 2 * 4 * (400 * MiB + 2 * 10 * MiB)
    assert plan(batch_size=64, res=host(memory_available_bytes=room)).num_workers == 4
    p = plan(batch_size=64, res=host(memory_available_bytes=room), val_batch_bytes=100 * MiB)
    assert p.num_workers == 2  # 2 x 2 x (400 + 2 x 100) MiB fits, 3 would not
    assert "100.0 MiB, the larger of the train and val batches" in cap(p, "memory").reason


def test_no_shm_filesystem_is_not_capped():
    p = plan(batch_size=64, res=host(shm_free_bytes=None, shm_total_bytes=None))
    assert p.num_workers == 8 and p.shm_budget_bytes is None
    assert not cap(p, "shm").applied and "not capped" in cap(p, "shm").reason


def test_memory_cap():
    # Persistent train and val workers are alive together: 3 of each fit.
    room = MAIN_PROCESS_HEADROOM + 2 * 3 * (400 * MiB + 2 * 10 * MiB)
    p = plan(batch_size=64, res=host(memory_available_bytes=room))
    assert p.num_workers == 3 and cap(p, "memory").applied and "train + val" in cap(p, "memory").reason
    p = plan(batch_size=64, res=host(memory_available_bytes=room), persistent_workers=False)
    assert p.num_workers == 6  # one set of workers at a time
    p = plan(batch_size=64, res=host(memory_available_bytes=MAIN_PROCESS_HEADROOM // 2))
    assert p.num_workers == 1  # floor one worker


def test_inherited_is_a_ceiling_under_cpu_and_shm():
    p = plan("inherited", 64, batch_size=64, res=host(usable_cpus=2, affinity_cpus=2))
    assert p.num_workers == 2 and p.source == "inherited" and cap(p, "cpu").applied
    p = plan("inherited", 64, batch_size=64, res=host(usable_cpus=64, shm_free_bytes=200 * MiB))
    assert p.num_workers == 3 and cap(p, "shm").applied
    assert plan("inherited", 3).num_workers == 3  # below every cap: honoured


def test_explicit_is_honoured_with_warnings():
    p = plan("explicit", 12, batch_size=64, res=host(usable_cpus=2, shm_free_bytes=64 * MiB), prefetch=4)
    assert p.num_workers == 12 and p.prefetch_factor == 4 and not p.caps
    text = " ".join(p.warnings)
    assert "12 workers on 2 usable CPUs" in text
    assert "490.0 + 490.0 = 980.0 MiB" in text and "32.0 MiB" in text  # both loaders vs the budget


def test_explicit_zero_sets_nothing_torch_rejects():
    p = plan("explicit", 0)
    assert p.dataloader_kwargs() == {"num_workers": 0, "pin_memory": False}


def test_pin_memory_only_for_cuda():
    assert not plan().pin_memory
    assert plan("auto", None, 16, MiB, 2, host(), cuda=True).pin_memory
    assert not plan("auto", None, 16, MiB, 2, host(), cuda=True, pin_memory=False).pin_memory


def test_fd_warning_when_near_nofile():
    p = plan("explicit", 4, prefetch=4, res=host(nofile_soft=128))
    assert any("RLIMIT_NOFILE" in w for w in p.warnings)


def test_map_count_warning_when_in_flight_maps_near_max_map_count():
    p = plan("explicit", 4, prefetch=4, res=host(max_map_count=200))  # 4 x 4 batches x 8 tensors = 128 maps
    assert any("vm.max_map_count 200" in w for w in p.warnings)
    assert not any("max_map_count" in w for w in plan("explicit", 4, prefetch=4).warnings)


def test_invalid_arguments_fail_loudly():
    with pytest.raises(ValueError, match="auto, explicit or inherited"):  # the schema's ConfigError is a ValueError
        plan("sometimes")
    with pytest.raises(ValueError, match="worker count"):
        plan("explicit", None)
    with pytest.raises(ValueError, match="prefetch_factor"):
        plan(prefetch=0)


def test_table_names_every_cap():
    p = plan(batch_size=64, res=host(shm_free_bytes=200 * MiB))
    table = p.table()
    assert "cap shm" in table and "APPLIED" in table and "cap memory" in table


def request(policy="auto", num_workers=None, overrides=(), environ=None):
    from cocodet.loader.plan.request import worker_request

    return worker_request(
        policy, num_workers, ["COCODET_NUM_WORKERS", "SLURM_CPUS_PER_TASK"], list(overrides), environ or {}
    )


def test_worker_request_sources():
    from cocodet.errors import ConfigError

    assert request() == ("auto", None)
    # named on this run's command line -> explicit; arriving from a preset file -> inherited
    assert request(num_workers=3, overrides=["loader.num_workers=3"]) == ("explicit", 3)
    assert request(num_workers=3, overrides=["experiment=x"]) == ("inherited", 3)
    assert request("explicit", 5) == ("explicit", 5)
    assert request("inherited", environ={"SLURM_CPUS_PER_TASK": "16"}) == ("inherited", 16)
    assert request("inherited", 2) == ("inherited", 2)
    with pytest.raises(ConfigError, match="SLURM_CPUS_PER_TASK"):
        request("inherited")
    with pytest.raises(ConfigError, match="loader.num_workers=N"):
        request("explicit")


def test_the_plan_sizes_the_window_cache_in_memory_not_in_shm():
    """Window partners: the cache holds the window and the positions in flight, in anonymous
    shared memory (a 64 MB /dev/shm does not shrink it); memory the workers leave caps it."""
    from cocodet.window_slot import slot_bytes

    small_shm = host(shm_total_bytes=64 * MiB, shm_free_bytes=64 * MiB)
    p = plan("explicit", 2, batch_size=32, batch_bytes=38 * MiB, res=small_shm, partner_window=48, image_side=640)
    assert p.window_slots == 48 + (2 * 2 + 1) * 32 and p.window_bytes == p.window_slots * slot_bytes(640)
    assert "window cache" in p.table() and "memfd, not /dev/shm" in p.table() and f"{p.window_slots} slots" in p.table()
    tight = plan(
        "explicit",
        2,
        batch_size=32,
        batch_bytes=38 * MiB,
        partner_window=48,
        image_side=640,
        res=host(memory_available_bytes=4 * GiB),
    )
    assert 0 < tight.window_slots < p.window_slots and "fewer partners are read" in tight.window_note
    assert plan(batch_size=32, batch_bytes=38 * MiB, image_side=640).window_slots == 0  # no window: no cache

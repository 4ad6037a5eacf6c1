"""The loader plan: how many workers, and why (design §3).

``plan_loader`` is a pure function of its arguments, so every branch is testable without
a machine that has the condition. Sources:
    auto       min(usable CPUs, batch size), then the shm and memory caps.
    explicit   the user's own count for this run, honoured; warnings give the numbers.
    inherited  a count from outside this run (scheduler variable, preset): a ceiling under the
               CPU, shm and memory caps.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from functools import partial

from cocodet import schema
from cocodet.errors import ConfigError
from cocodet.loader.resources import HostResources
from cocodet.units import MiB, mib

log = logging.getLogger(__name__)

# Unique memory of one worker process (torch + cv2 + albumentations imported, dataset index
# shared copy-on-write), estimated from the USS of workers on this stack (~250-300 MiB) plus
# the decode/augment working set. `mode=bench` prints the measured value next to it.
DEFAULT_WORKER_FOOTPRINT = 400 * MiB
MAIN_PROCESS_HEADROOM = 2048 * MiB
TENSORS_PER_BATCH = 8  # FlatBatch: each storage is one fd and one mmap while in flight


@dataclass
class LoaderPlan:
    num_workers: int
    source: str
    requested: int | None
    batch_size: int
    batch_bytes: int
    part_images: int | None  # images per part when workers ship batches in parts (None: whole batches)
    prefetch_factor: int | None
    pin_memory: bool
    persistent_workers: bool
    shm_free_bytes: int | None
    shm_budget_bytes: int | None
    inflight_bytes: int
    fds_per_batch: int
    inflight_fds: int
    nofile_soft: int
    max_map_count: int | None
    usable_cpus: int
    memory_available_bytes: int
    worker_footprint_bytes: int
    footprint_source: str
    timeout_s: float = 0.0  # seconds a batch may take before the loader fails (0: wait forever)
    local_ranks: int = 1  # processes of this run on this host: they share its CPUs, /dev/shm and memory
    host_cpus: int | None = None  # this host's CPUs for the run (affinity, quota), before dividing among ranks
    caps: list[dict] = field(default_factory=list)  # every cap evaluated: name, limit, applied, reason
    warnings: list[str] = field(default_factory=list)
    # The validation loader's plan, made against the same shm budget (None: the same as this plan).
    val: "LoaderPlan | None" = None
    # Bytes of the shm budget each loader may use: its in-flight transfers plus the one its batch
    # or part in the main process holds (the step's batch, a part being joined).
    shm_split: dict | None = None

    def for_stage(self, stage: str) -> "LoaderPlan":
        """The plan of the loader named ``stage`` ("val": the validation loader's)."""
        return self.val if stage == "val" and self.val is not None else self

    def dataloader_kwargs(self) -> dict:
        """Arguments for torch's DataLoader; none that PyTorch rejects at num_workers=0."""
        kwargs = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            kwargs.update(prefetch_factor=self.prefetch_factor, persistent_workers=self.persistent_workers,
                          timeout=self.timeout_s)
        return kwargs

    def summary(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        """The plan as a small fixed-width table for the log."""
        rows = [
            ("workers", f"{self.num_workers} (source: {self.source}, requested: {self.requested})"),
            ("batch", f"{self.batch_size} images, {mib(self.batch_bytes)} per FlatBatch"
                      + (f", shipped in parts of {self.part_images} images" if self.part_images else "")),
            ("prefetch / pin / persistent", f"{self.prefetch_factor} / {self.pin_memory} / {self.persistent_workers}"),
            ("in flight", f"{mib(self.inflight_bytes)}, {self.inflight_fds} fds/maps ({self.fds_per_batch} per batch)"),
            ("local ranks on this host", str(self.local_ranks)),
            ("CPUs: host / per rank", f"{self.host_cpus} / {self.usable_cpus}"),
            ("/dev/shm: host free / rank budget", f"{mib(self.shm_free_bytes)} / {mib(self.shm_budget_bytes)}"),
            ("memory: host available / per rank", f"{mib(self.memory_available_bytes)} / "
                                                  f"{mib(self.memory_available_bytes // max(1, self.local_ranks))}; "
                                                  f"worker footprint {mib(self.worker_footprint_bytes)} ({self.footprint_source})"),
            ("RLIMIT_NOFILE / vm.max_map_count", f"{self.nofile_soft} / {self.max_map_count}"),
        ]
        for cap in self.caps:
            mark = "APPLIED" if cap["applied"] else "ok"
            rows.append((f"cap {cap['name']}", f"<= {cap['limit']} [{mark}] {cap['reason']}"))
        if self.shm_split:
            rows.append(("shm split", shm_split_text(self.shm_split)))
        if self.val is not None:
            v = self.val
            shipped = f"parts of {v.part_images} images" if v.part_images else "whole batches"
            rows.append(("val loader", f"{v.num_workers} worker(s), prefetch {v.prefetch_factor}, {shipped} "
                                       f"({mib(v.batch_bytes)} per batch), {mib(v.inflight_bytes)} in flight"))
            rows += [(f"val cap {c['name']}", f"<= {c['limit']} [{'APPLIED' if c['applied'] else 'ok'}] {c['reason']}")
                     for c in v.caps if c["name"] == "shm"]
        for w in self.warnings:
            rows.append(("WARNING", w))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def worker_request(policy: str, num_workers: int | None, inherit_from: list[str], overrides: list[str],
                   environ: dict[str, str]) -> tuple[str, int | None]:
    """Turn the policy name, this run's overrides and the environment into (source, count).

    A count named on this run's command line is explicit. A count that arrives any other way
    (a preset or experiment file, or a scheduler variable for ``loader=inherited``) is
    inherited. ``auto`` without a count computes its own (count None).
    """
    schema.check("loader.policy", policy)
    named_here = any(o.lstrip("+~").split("=", 1)[0] == "loader.num_workers" for o in overrides)
    if policy == "explicit":
        if num_workers is None:
            raise ConfigError("loader=explicit needs a count: add loader.num_workers=N (or use loader=auto)")
        return "explicit", int(num_workers)
    if policy == "auto":
        if num_workers is None:
            return "auto", None
        return ("explicit" if named_here else "inherited"), int(num_workers)
    if named_here:  # inherited, but this run names its own count
        return "explicit", int(num_workers)
    for var in inherit_from:  # inherited: a scheduler's variable, else a preset's count
        value = environ.get(var, "")
        if value.strip().isdigit():
            log.info("inherited worker count %s from $%s", value, var)
            return "inherited", int(value)
    if num_workers is not None:
        return "inherited", int(num_workers)
    raise ConfigError(f"loader=inherited found no count: none of ${', $'.join(inherit_from)} is set and "
                      "loader.num_workers is null. Set one of them, or use loader=auto")


def shm_split_text(split: dict) -> str:
    def part(name: str) -> str:
        return f"{name} {mib(split[name])}"
    return (f"{mib(split['budget'])} budget = {part('train')} + {part('val')} (each: in flight + 1 held by the main "
            f"process) + {mib(split['budget'] - split['train'] - split['val'])} spare")


def _shm_budget(res: HostResources) -> int | None:
    if res.shm_free_bytes is None:
        return None
    return res.shm_free_bytes // 2 // max(1, res.local_world_size)


@dataclass(frozen=True)
class _Budget:
    """What the host allows this rank's loaders, and what one worker costs."""
    shm: int | None  # bytes of /dev/shm (None: no shm filesystem, not capped)
    mem_room: int  # bytes of memory for workers after the main process's headroom
    footprint: int  # one worker's own memory
    largest_batch: int  # the larger of a train and a val batch, in a worker's queue
    worker_sets: int  # 2 with persistent workers: the train and the val workers live side by side
    ranks: int


@dataclass
class _Draft:
    """The plan as the steps of ``plan_loader`` shape it."""
    workers: int
    prefetch: int
    part_images: int | None
    ship_bytes: int  # bytes of one shm transfer: a batch, or a part of one
    per_image: float
    batch_bytes: int  # bytes of one whole batch
    caps: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def shm_limit(self, share: int | None, prefetch: int) -> int | None:
        """Workers whose transfers, plus the one the main process holds, fit ``share``."""
        return None if share is None else max(0, share // self.ship_bytes - 1) // prefetch

    def shm_bytes(self) -> int:
        """What this loader holds in shm at most: its transfers in flight and the one in the main process."""
        return (self.workers * self.prefetch + 1) * self.ship_bytes if self.workers > 0 else 0


def plan_loader(policy: str, requested: int | None, batch_size: int, batch_bytes: int, prefetch_factor: int,
                resources: HostResources, cuda: bool, pin_memory: bool | str = "auto",
                persistent_workers: bool = True, worker_footprint_bytes: int | None = None,
                part_images: int | None = None, partner_pool: int = 0, timeout_s: float = 0.0,
                val_batch_bytes: int | None = None, val_batch_size: int | None = None) -> LoaderPlan:
    """Decide the worker counts and DataLoader settings of the train and val loaders, recording
    every cap and warning.

    Args:
        policy: "auto", "explicit" or "inherited".
        requested: the explicit or inherited count (ignored by auto).
        batch_bytes: bytes of one transported batch (see flat_layout.batch_bytes).
        resources: a HostResources snapshot (resources.probe()).
        cuda: batches go to a CUDA device (pin_memory="auto" pins only then).
        part_images: ship batches in parts of this many images (None: whole batches, or parts
            when not even one whole batch fits the shm budget).
        partner_pool: the recipe's partner pool; planned parts are a multiple of it when
            possible, so each part still decodes each image once.
        val_batch_bytes, val_batch_size: one validation batch (None: the same as a train batch).
            The train workers stream on into the next epoch while validation runs, so both
            loaders share one shm budget (``plan.shm_split``; ``plan.val`` is the val plan); the
            memory cap budgets each worker's queue at the larger batch, and both worker sets.
    """
    _check_request(policy, requested, prefetch_factor)
    ranks = max(1, resources.local_world_size)
    footprint = worker_footprint_bytes or DEFAULT_WORKER_FOOTPRINT
    # Each local rank plans alone, so each gets its share of the host's memory.
    budget = _Budget(shm=_shm_budget(resources),
                     mem_room=resources.memory_available_bytes // ranks - MAIN_PROCESS_HEADROOM,
                     footprint=footprint, largest_batch=max(batch_bytes, val_batch_bytes or 0),
                     worker_sets=2 if persistent_workers else 1, ranks=ranks)
    if part_images is not None and part_images >= batch_size:
        part_images = None
    train = _draft(batch_bytes, batch_size, prefetch_factor, part_images)
    val_size = val_batch_size or batch_size
    val = _draft(val_batch_bytes or batch_bytes, val_size, prefetch_factor,
                 part_images if part_images is not None and part_images < val_size else None)
    if policy == "explicit":
        train.workers = val.workers = requested
    else:
        train.workers = min(resources.usable_cpus, batch_size) if policy == "auto" else requested
        if policy == "inherited":
            _cap_cpu(train, resources)
        _share_shm(train, val, budget, resources, partner_pool)
        _cap_memory(train, budget, resources)
        val.workers = min(val.workers, max(1, train.workers))
    _warn(train, val, policy, budget, resources)
    final = partial(_final_plan, policy=policy, requested=requested, res=resources, b=budget, cuda=cuda,
                    pin_memory=pin_memory, persistent_workers=persistent_workers,
                    footprint_given=bool(worker_footprint_bytes), timeout_s=timeout_s)
    plan = final(train, batch_size=batch_size, batch_bytes=batch_bytes)
    plan.val = final(val, batch_size=val_size, batch_bytes=val_batch_bytes or batch_bytes)
    if budget.shm is not None:
        plan.shm_split = {"budget": budget.shm, "train": train.shm_bytes(), "val": val.shm_bytes()}
    return plan


def _draft(batch_bytes: int, batch_size: int, prefetch: int, part_images: int | None) -> _Draft:
    per_image = batch_bytes / batch_size
    return _Draft(workers=0, prefetch=prefetch, part_images=part_images, per_image=per_image, batch_bytes=batch_bytes,
                  ship_bytes=batch_bytes if part_images is None else int(per_image * part_images))


def _share_shm(train: _Draft, val: _Draft, b: _Budget, res: HostResources, partner_pool: int) -> None:
    """One shm budget for both loaders: validation is reserved the least that keeps one val
    worker (within a quarter of the budget: validation is the shorter stage, and training's
    parts then stay large enough for whole partner pools), training is capped in the rest, and
    validation then takes what training left, up to training's worker count."""
    if b.shm is None:
        _cap_shm(train, None, "", res, 0)
        val.workers, val.prefetch = max(1, train.workers), train.prefetch
        return
    probe = _draft(val.batch_bytes, max(1, round(val.batch_bytes / val.per_image)), 1, val.part_images)
    probe.workers = 1
    _cap_shm(probe, b.shm // 4, "", res, 0)
    reserve = probe.shm_bytes()
    whole = f"{b.shm / MiB:.1f} MiB budget ({{budget}})"
    _cap_shm(train, b.shm - reserve, f"{whole} - {reserve / MiB:.1f} MiB kept for one val worker", res, partner_pool)
    val.workers = max(1, train.workers)
    left = b.shm - train.shm_bytes()
    _cap_shm(val, left, f"{whole} - {train.shm_bytes() / MiB:.1f} MiB of the train loader", res, 0)


def _check_request(policy: str, requested: int | None, prefetch_factor: int) -> None:
    schema.check("loader.policy", policy)
    schema.check("loader.prefetch_factor", prefetch_factor)
    if policy != "auto" and (requested is None or requested < 0):
        raise ValueError(f"loader policy {policy!r} needs a worker count >= 0, got {requested!r}")


def _cap_cpu(d: _Draft, res: HostResources) -> None:
    """An inherited count is a ceiling: no more workers than this rank's usable CPUs."""
    cpus = res.usable_cpus
    d.caps.append({"name": "cpu", "limit": cpus, "applied": d.workers > cpus,
                   "reason": f"{cpus} usable CPUs for this rank (affinity {res.affinity_cpus}, "
                             f"quota {res.cgroup_cpus}, {res.local_world_size} local ranks)"})
    d.workers = min(d.workers, cpus)


def _cap_shm(d: _Draft, share: int | None, share_text: str, res: HostResources, partner_pool: int) -> None:
    """In-flight transfers, and the one the main process holds, fit ``share`` of the rank's shm
    budget; when not one worker's queue does, lower prefetch, then ship batches in parts, then
    load in the main process."""
    limit = d.shm_limit(share, d.prefetch)
    if limit is None:
        d.caps.append({"name": "shm", "limit": None, "applied": False,
                       "reason": f"no shm filesystem at {res.shm_path}: not capped"})
        return
    applied = d.workers > max(1, limit)
    budget = f"half of {res.shm_free_bytes / MiB:.1f} MiB free shm / {res.local_world_size} ranks"
    reason = (f"(workers x prefetch {d.prefetch} + 1 held by the main process) x {d.ship_bytes / MiB:.1f} MiB <= "
              f"{share / MiB:.1f} MiB" + (f" = {share_text.format(budget=budget)}" if share_text else f" ({budget})"))
    if d.workers > 0 and limit == 0:
        limit, more = _shrink_to_fit_shm(d, share, partner_pool)
        applied, reason = True, reason + more
    d.caps.append({"name": "shm", "limit": max(limit, 0), "applied": applied, "reason": reason})
    d.workers = min(d.workers, max(1, limit)) if limit >= 1 else 0


def _shrink_to_fit_shm(d: _Draft, share: int, partner_pool: int) -> tuple[int, str]:
    """Not even one worker's queue fits: shrink the queue before giving up on workers. Returns
    the shm limit on workers and the reason's addition."""
    batch_bytes = d.batch_bytes
    fit = int(share // d.per_image)  # whole images that fit the share at once
    shm_size = -(-4 * batch_bytes // MiB)
    if d.shm_limit(share, 1) >= 1:
        d.prefetch = 1
        return 1, "; one worker at prefetch 1 fits, so prefetch lowered to 1"
    if d.part_images is None and fit >= 2:
        # Ship each batch in parts that fit: one part per worker in flight and one being joined.
        # Parts are whole partner pools when they fit (a part that splits a pool decodes the
        # partners it draws from the other part again), fewer workers if need be.
        if partner_pool > 1 and fit >= 2 * partner_pool:
            d.workers = min(d.workers, fit // partner_pool - 1)
            d.part_images = (fit // (d.workers + 1)) // partner_pool * partner_pool
        elif partner_pool > 1:  # not two pools: one worker, the largest parts (the fewest pools split)
            d.workers, d.part_images = 1, fit // 2
        else:
            d.workers = min(d.workers, fit - 1)
            d.part_images = fit // (d.workers + 1)
        d.ship_bytes, d.prefetch = int(d.per_image * d.part_images), 1
        return d.workers, (f"; one batch ({batch_bytes / MiB:.1f} MiB) exceeds it, so workers ship it in "
                           f"parts of {d.part_images} images ({d.ship_bytes / MiB:.1f} MiB) at prefetch 1, joined "
                           f"before the step; --shm-size >= {shm_size}m ships whole batches")
    return 0, (f"; one batch ({batch_bytes / MiB:.1f} MiB) exceeds it, so batches are loaded in the main "
               f"process (no shm); give the container --shm-size >= {shm_size}m or lower the batch size to use "
               "workers")


def _cap_memory(d: _Draft, b: _Budget, res: HostResources) -> None:
    """Workers (both sets when persistent) with their queues fit the rank's memory."""
    m = max(0, b.mem_room // (b.worker_sets * (b.footprint + d.prefetch * b.largest_batch)))
    applied = d.workers > max(1, m)
    d.caps.append({"name": "memory", "limit": m, "applied": applied,
                   "reason": f"{'2 (train + val, persistent) x ' if b.worker_sets == 2 else ''}workers x "
                             f"({b.footprint / MiB:.0f} MiB footprint + prefetch x {b.largest_batch / MiB:.1f} MiB, the "
                             f"larger of the train and val batches) <= "
                             f"{res.memory_available_bytes / MiB:.0f} MiB available ({res.memory_source}) "
                             f"{f'/ {b.ranks} local ranks ' if b.ranks > 1 else ''}"
                             f"- {MAIN_PROCESS_HEADROOM / MiB:.0f} MiB main-process headroom"})
    if applied:
        d.workers = max(1, m)


def _warn(train: _Draft, val: _Draft, policy: str, b: _Budget, res: HostResources) -> None:
    """Warnings with the numbers: an explicit count over a budget, fds and maps near their limits."""
    d = train
    inflight_fds = (train.workers * train.prefetch + val.workers * val.prefetch) * TENSORS_PER_BATCH
    if policy == "explicit":
        _warn_explicit(train, val, b, res)
    if d.workers > 0 and inflight_fds + 64 > res.nofile_soft:
        d.warnings.append(f"{inflight_fds} fds in flight near RLIMIT_NOFILE {res.nofile_soft}: raise `ulimit -n`")
    # Every in-flight storage is also one memory map; the process's other maps (libraries,
    # allocator arenas) take thousands more, so warn at half of vm.max_map_count.
    if d.workers > 0 and res.max_map_count and inflight_fds > res.max_map_count // 2:
        d.warnings.append(f"{inflight_fds} memory maps in flight against vm.max_map_count {res.max_map_count}: "
                          "expect 'unable to mmap N bytes'; lower loader.prefetch_factor or workers (the sysctl is "
                          "the host's to raise)")


def _warn_explicit(d: _Draft, val: _Draft, b: _Budget, res: HostResources) -> None:
    """An explicit count is honoured, by both loaders; say what it exceeds."""
    workers, prefetch = d.workers, d.prefetch
    needed = d.shm_bytes() + val.shm_bytes()
    if workers > res.usable_cpus:
        d.warnings.append(f"{workers} workers on {res.usable_cpus} usable CPUs: workers will contend for cores and "
                          "each step may get slower")
    if b.shm is not None and workers > 0 and needed > b.shm:
        fit = max(1, int(b.shm / 2 // ((workers + 1) * d.per_image)))
        d.warnings.append(f"the train and val loaders need {d.shm_bytes() / MiB:.1f} + {val.shm_bytes() / MiB:.1f} = "
                          f"{needed / MiB:.1f} MiB of shm ({workers} workers x prefetch {prefetch}, plus the batch the "
                          f"main process holds, each) but the budget is {b.shm / MiB:.1f} MiB "
                          f"({res.shm_free_bytes / MiB:.1f} MiB free at {res.shm_path}); expect 'Bus error' or "
                          f"'No space left on device'. Fix: loader=auto, a lower loader.prefetch_factor, "
                          f"loader.part_images={fit}, or --shm-size")
    if workers > 0 and b.worker_sets * workers * (b.footprint + prefetch * b.largest_batch) > b.mem_room:
        d.warnings.append(f"{b.worker_sets * workers} workers (train and val) x "
                          f"~{(b.footprint + prefetch * b.largest_batch) / MiB:.0f} MiB may exceed the "
                          f"{res.memory_available_bytes / MiB:.0f} MiB available; the OOM killer would end workers "
                          "with SIGKILL")


def _final_plan(d: _Draft, policy: str, requested: int | None, batch_size: int, batch_bytes: int,
                res: HostResources, b: _Budget, *, cuda: bool, pin_memory: bool | str, persistent_workers: bool,
                footprint_given: bool, timeout_s: float) -> LoaderPlan:
    """The LoaderPlan of a finished draft; nothing PyTorch rejects at num_workers=0."""
    with_workers = d.workers > 0
    inflight = d.workers * d.prefetch
    return LoaderPlan(
        num_workers=d.workers, source=policy, requested=requested, batch_size=batch_size, batch_bytes=batch_bytes,
        part_images=d.part_images if with_workers else None,
        prefetch_factor=d.prefetch if with_workers else None,
        pin_memory=bool(cuda) if pin_memory == "auto" else bool(pin_memory),
        persistent_workers=bool(persistent_workers and with_workers),
        shm_free_bytes=res.shm_free_bytes, shm_budget_bytes=b.shm,
        inflight_bytes=inflight * d.ship_bytes if with_workers else 0, fds_per_batch=TENSORS_PER_BATCH,
        inflight_fds=inflight * TENSORS_PER_BATCH if with_workers else 0, nofile_soft=res.nofile_soft,
        max_map_count=res.max_map_count, usable_cpus=res.usable_cpus,
        memory_available_bytes=res.memory_available_bytes, worker_footprint_bytes=b.footprint,
        footprint_source="given" if footprint_given else "estimated", timeout_s=float(timeout_s),
        local_ranks=b.ranks, host_cpus=min(res.affinity_cpus, int(res.cgroup_cpus or res.affinity_cpus)),
        caps=d.caps, warnings=d.warnings,
    )

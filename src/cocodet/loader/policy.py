"""The loader plan: how many workers, and why (DESIGN §3).

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

from cocodet.config import ConfigError
from cocodet.loader.resources import HostResources

log = logging.getLogger(__name__)

MiB = 1 << 20
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
        def mb(x):
            return "-" if x is None else f"{x / MiB:.1f} MiB"

        rows = [
            ("workers", f"{self.num_workers} (source: {self.source}, requested: {self.requested})"),
            ("batch", f"{self.batch_size} images, {mb(self.batch_bytes)} per FlatBatch"
                      + (f", shipped in parts of {self.part_images} images" if self.part_images else "")),
            ("prefetch / pin / persistent", f"{self.prefetch_factor} / {self.pin_memory} / {self.persistent_workers}"),
            ("in flight", f"{mb(self.inflight_bytes)}, {self.inflight_fds} fds/maps ({self.fds_per_batch} per batch)"),
            ("local ranks on this host", str(self.local_ranks)),
            ("CPUs: host / per rank", f"{self.host_cpus} / {self.usable_cpus}"),
            ("/dev/shm: host free / rank budget", f"{mb(self.shm_free_bytes)} / {mb(self.shm_budget_bytes)}"),
            ("memory: host available / per rank", f"{mb(self.memory_available_bytes)} / "
                                                  f"{mb(self.memory_available_bytes // max(1, self.local_ranks))}; "
                                                  f"worker footprint {mb(self.worker_footprint_bytes)} ({self.footprint_source})"),
            ("RLIMIT_NOFILE / vm.max_map_count", f"{self.nofile_soft} / {self.max_map_count}"),
        ]
        for cap in self.caps:
            mark = "APPLIED" if cap["applied"] else "ok"
            rows.append((f"cap {cap['name']}", f"<= {cap['limit']} [{mark}] {cap['reason']}"))
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
    named_here = any(o.lstrip("+~").split("=", 1)[0] == "loader.num_workers" for o in overrides)
    if policy == "explicit":
        if num_workers is None:
            raise ConfigError("loader=explicit needs a count: add loader.num_workers=N (or use loader=auto)")
        return "explicit", int(num_workers)
    if policy == "auto":
        if num_workers is None:
            return "auto", None
        return ("explicit" if named_here else "inherited"), int(num_workers)
    if policy == "inherited":
        if named_here:
            return "explicit", int(num_workers)
        for var in inherit_from:
            value = environ.get(var, "")
            if value.strip().isdigit():
                log.info("inherited worker count %s from $%s", value, var)
                return "inherited", int(value)
        if num_workers is not None:
            return "inherited", int(num_workers)
        raise ConfigError(f"loader=inherited found no count: none of ${', $'.join(inherit_from)} is set and "
                          "loader.num_workers is null. Set one of them, or use loader=auto")
    raise ConfigError(f"loader.policy={policy!r} is not allowed: expected auto, explicit or inherited")


def _shm_budget(res: HostResources) -> int | None:
    if res.shm_free_bytes is None:
        return None
    return res.shm_free_bytes // 2 // max(1, res.local_world_size)


def plan_loader(policy: str, requested: int | None, batch_size: int, batch_bytes: int, prefetch_factor: int,
                resources: HostResources, cuda: bool, pin_memory: bool | str = "auto",
                persistent_workers: bool = True, worker_footprint_bytes: int | None = None,
                part_images: int | None = None, partner_pool: int = 0, timeout_s: float = 0.0,
                val_batch_bytes: int | None = None) -> LoaderPlan:
    """Decide the worker count and DataLoader settings, recording every cap and warning.

    Args:
        policy: "auto", "explicit" or "inherited".
        requested: the explicit or inherited count (ignored by auto).
        batch_bytes: bytes of one transported batch (see flat_batch.batch_bytes).
        resources: a HostResources snapshot (resources.probe()).
        cuda: batches go to a CUDA device (pin_memory="auto" pins only then).
        part_images: ship batches in parts of this many images (None: whole batches, or parts
            when not even one whole batch fits the shm budget).
        partner_pool: the recipe's partner pool; planned parts are a multiple of it when
            possible, so each part still decodes each image once.
        val_batch_bytes: bytes of one validation batch (None: the same as a train batch). The
            memory cap budgets each worker's queue at the larger of the two, and, with
            persistent workers, the train and the val workers, which are alive together.
    """
    if policy not in ("auto", "explicit", "inherited"):
        raise ValueError(f"unknown loader policy {policy!r}; choose auto, explicit or inherited")
    if policy != "auto" and (requested is None or requested < 0):
        raise ValueError(f"loader policy {policy!r} needs a worker count >= 0, got {requested!r}")
    if prefetch_factor < 1:
        raise ValueError(f"loader.prefetch_factor must be >= 1, got {prefetch_factor}")
    footprint = worker_footprint_bytes or DEFAULT_WORKER_FOOTPRINT
    caps: list[dict] = []
    warnings: list[str] = []
    budget = _shm_budget(resources)
    cpus = resources.usable_cpus
    ranks = max(1, resources.local_world_size)
    # Each local rank plans alone, so each gets its share of the host's memory.
    mem_room = resources.memory_available_bytes // ranks - MAIN_PROCESS_HEADROOM

    per_image = batch_bytes / batch_size
    if part_images is not None and part_images >= batch_size:
        part_images = None
    ship_bytes = batch_bytes if part_images is None else int(per_image * part_images)  # one shm transfer

    def shm_limit(prefetch: int) -> int | None:
        return None if budget is None else budget // (prefetch * ship_bytes)

    largest_batch = max(batch_bytes, val_batch_bytes or 0)
    worker_sets = 2 if persistent_workers else 1  # persistent train and val workers live side by side

    def mem_limit(prefetch: int) -> int:
        return max(0, mem_room // (worker_sets * (footprint + prefetch * largest_batch)))

    if policy == "explicit":
        workers = requested
    else:
        workers = min(cpus, batch_size) if policy == "auto" else requested
        if policy == "inherited":
            caps.append({"name": "cpu", "limit": cpus, "applied": workers > cpus,
                         "reason": f"{cpus} usable CPUs for this rank (affinity {resources.affinity_cpus}, "
                                   f"quota {resources.cgroup_cpus}, {resources.local_world_size} local ranks)"})
            workers = min(workers, cpus)
        limit = shm_limit(prefetch_factor)
        if limit is None:
            caps.append({"name": "shm", "limit": None, "applied": False, "reason": f"no shm filesystem at {resources.shm_path}: not capped"})
        else:
            applied = workers > max(1, limit)
            reason = (f"workers x prefetch {prefetch_factor} x {ship_bytes / MiB:.1f} MiB <= half of "
                      f"{resources.shm_free_bytes / MiB:.1f} MiB free shm / {resources.local_world_size} ranks = {budget / MiB:.1f} MiB")
            if workers > 0 and limit == 0:
                # Not even one worker's queue fits: shrink the queue before giving up on workers.
                fit = int(budget // per_image)  # whole images that fit the budget at once
                if shm_limit(1) >= 1:
                    prefetch_factor, applied = 1, True
                    reason += f"; one worker at prefetch {prefetch_factor} fits, so prefetch lowered to 1"
                    limit = 1
                elif part_images is None and fit >= 1:
                    # Ship each batch in parts that fit: one part per worker in flight. Parts
                    # are whole partner pools when one fits (a part that splits a pool decodes
                    # the partners it draws from the other part again), fewer workers if need be.
                    if partner_pool > 1 and fit >= partner_pool:
                        workers = min(workers, fit // partner_pool)
                        part_images = (fit // workers) // partner_pool * partner_pool
                    else:
                        workers = min(workers, fit)
                        part_images = fit // workers
                    ship_bytes = int(per_image * part_images)
                    prefetch_factor, applied, limit = 1, True, workers
                    reason += (f"; one batch ({batch_bytes / MiB:.1f} MiB) exceeds the budget, so workers ship it in "
                               f"parts of {part_images} images ({ship_bytes / MiB:.1f} MiB) at prefetch 1, joined "
                               f"before the step; --shm-size >= {-(-4 * batch_bytes // MiB)}m ships whole batches")
                else:
                    reason += (f"; one batch ({batch_bytes / MiB:.1f} MiB) exceeds the budget, so batches are "
                               f"loaded in the main process (no shm); give the container --shm-size >= "
                               f"{-(-4 * batch_bytes // MiB)}m or lower loader.batch_size to use workers")
                    applied = True
            caps.append({"name": "shm", "limit": max(limit, 0), "applied": applied, "reason": reason})
            workers = min(workers, max(1, limit)) if limit >= 1 else 0
        m = mem_limit(prefetch_factor)
        applied = workers > max(1, m)
        caps.append({"name": "memory", "limit": m, "applied": applied,
                     "reason": f"{'2 (train + val, persistent) x ' if worker_sets == 2 else ''}workers x "
                               f"({footprint / MiB:.0f} MiB footprint + prefetch x {largest_batch / MiB:.1f} MiB, the "
                               f"larger of the train and val batches) <= "
                               f"{resources.memory_available_bytes / MiB:.0f} MiB available ({resources.memory_source}) "
                               f"{f'/ {ranks} local ranks ' if ranks > 1 else ''}"
                               f"- {MAIN_PROCESS_HEADROOM / MiB:.0f} MiB main-process headroom"})
        if applied:
            workers = max(1, m)

    inflight_batches = workers * prefetch_factor
    inflight_bytes = inflight_batches * ship_bytes
    inflight_fds = inflight_batches * TENSORS_PER_BATCH
    if policy == "explicit":
        if workers > cpus:
            warnings.append(f"{workers} workers on {cpus} usable CPUs: workers will contend for cores and each step may get slower")
        if budget is not None and workers > 0 and inflight_bytes > budget:
            warnings.append(f"in-flight batches need {workers} x {prefetch_factor} x {ship_bytes / MiB:.1f} MiB = "
                            f"{inflight_bytes / MiB:.1f} MiB of shm but the budget is {budget / MiB:.1f} MiB "
                            f"({resources.shm_free_bytes / MiB:.1f} MiB free at {resources.shm_path}); expect 'Bus error' or "
                            f"'No space left on device'. Fix: loader=auto, a lower loader.prefetch_factor, "
                            f"loader.part_images={max(1, int(budget // (workers * prefetch_factor * per_image)))}, or --shm-size")
        if workers > 0 and worker_sets * workers * (footprint + prefetch_factor * largest_batch) > mem_room:
            warnings.append(f"{worker_sets * workers} workers (train and val) x "
                            f"~{(footprint + prefetch_factor * largest_batch) / MiB:.0f} MiB may exceed the "
                            f"{resources.memory_available_bytes / MiB:.0f} MiB available; the OOM killer would end workers with SIGKILL")
    if workers > 0 and inflight_fds + 64 > resources.nofile_soft:
        warnings.append(f"{inflight_fds} fds in flight near RLIMIT_NOFILE {resources.nofile_soft}: raise `ulimit -n`")
    # Every in-flight storage is also one memory map; the process's other maps (libraries,
    # allocator arenas) take thousands more, so warn at half of vm.max_map_count.
    if workers > 0 and resources.max_map_count and inflight_fds > resources.max_map_count // 2:
        warnings.append(f"{inflight_fds} memory maps in flight against vm.max_map_count {resources.max_map_count}: "
                        "expect 'unable to mmap N bytes'; lower loader.prefetch_factor or workers (the sysctl is "
                        "the host's to raise)")
    return LoaderPlan(
        num_workers=workers, source=policy, requested=requested, batch_size=batch_size, batch_bytes=batch_bytes,
        part_images=part_images if workers > 0 else None,
        prefetch_factor=prefetch_factor if workers > 0 else None,
        pin_memory=bool(cuda) if pin_memory == "auto" else bool(pin_memory),
        persistent_workers=bool(persistent_workers and workers > 0),
        shm_free_bytes=resources.shm_free_bytes, shm_budget_bytes=budget,
        inflight_bytes=inflight_bytes if workers > 0 else 0, fds_per_batch=TENSORS_PER_BATCH,
        inflight_fds=inflight_fds if workers > 0 else 0, nofile_soft=resources.nofile_soft,
        max_map_count=resources.max_map_count, usable_cpus=cpus,
        memory_available_bytes=resources.memory_available_bytes, worker_footprint_bytes=footprint,
        footprint_source="given" if worker_footprint_bytes else "estimated", timeout_s=float(timeout_s),
        local_ranks=ranks, host_cpus=min(resources.affinity_cpus, int(resources.cgroup_cpus or resources.affinity_cpus)),
        caps=caps,
        warnings=warnings,
    )

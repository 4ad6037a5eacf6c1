"""The loader plan's records (design §3): what the plan is asked (the request, the batch
geometry, the recipe's shape), its working records (``Budget``, each loader's ``LoaderDraft``,
each cap as a ``WorkerCap``, the window cache's ``Window``) and what it decides (``LoaderPlan``).
Plain dataclasses: ``summary()`` is the JSON the run's summary carries."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from cocodet import schema


@dataclass(frozen=True)
class WorkerCap:
    """One cap the plan evaluated: at most ``limit`` workers (None: not capped), whether it lowered the count,
    and the arithmetic behind it in words (written by ``reasons.explain`` once the numbers are final)."""

    name: str
    limit: int | None
    applied: bool
    reason: str = ""


@dataclass(frozen=True)
class ShmCheck:
    """What a loader's shm cap measured, for its words: the share of the budget it was checked
    against and how that share was cut ("" for the whole budget; it may name the budget as
    ``{budget}``), the queue as it stood then (prefetch, bytes per transfer), and what was given
    up when not one worker's queue fitted ("prefetch", "parts" or "main process")."""

    share: int
    share_text: str
    prefetch: int
    ship_bytes: int
    gave_up: str = ""


@dataclass(frozen=True)
class Budget:
    """What the host allows this rank's loaders, and what one worker costs."""

    shm: int | None  # bytes of /dev/shm (None: no shm filesystem, not capped)
    mem_room: int  # bytes of memory for workers after the main process's headroom
    footprint: int  # one worker's own memory
    largest_batch: int  # the larger of a train and a val batch, in a worker's queue
    worker_sets: int  # 2 with persistent workers: the train and the val workers live side by side
    ranks: int


@dataclass
class LoaderDraft:
    """One loader's plan as the steps of ``plan_loader`` shape it."""

    workers: int
    prefetch: int
    part_images: int | None
    ship_bytes: int  # bytes of one shm transfer: a batch, or a part of one
    per_image: float
    batch_bytes: int  # bytes of one whole batch
    caps: list[WorkerCap] = field(default_factory=list)
    shm_check: ShmCheck | None = None  # None: no shm filesystem (not capped), or not checked yet
    alarms: list[tuple[str, int]] = field(default_factory=list)  # (what, its figure): the warnings, as numbers

    def shm_limit(self, share: int | None, prefetch: int) -> int | None:
        """Workers whose transfers, plus the one the main process holds, fit ``share``."""
        return None if share is None else max(0, share // self.ship_bytes - 1) // prefetch

    def shm_bytes(self) -> int:
        """What this loader holds in shm at most: its transfers in flight and the one in the main process."""
        return (self.workers * self.prefetch + 1) * self.ship_bytes if self.workers > 0 else 0


@dataclass(frozen=True)
class Window:
    """The window cache's slots (``window_slots.py``): how many, how many the window and the positions in
    flight want, how many fit the memory the workers leave, that room, the positions in flight, and one slot's bytes."""

    slots: int
    want: int
    fit: int
    room: int
    in_flight: int
    slot_bytes: int


@dataclass(frozen=True)
class LoaderRequest:
    """What the configuration asks of the loader.

    Args:
        policy: "auto", "explicit" or "inherited".
        requested: the explicit or inherited count (ignored by auto).
        prefetch_factor: batches each worker keeps in flight, before any cap lowers it.
        pin_memory: True, False or "auto" (pin only when batches go to CUDA).
        worker_footprint_bytes: one worker's own memory when measured (None: the estimate).
        part_images: ship batches in parts of this many images (None: whole batches, or parts
            when not even one whole batch fits the shm budget).
        timeout_s: seconds a batch may take (0: wait forever).
    """

    policy: str
    requested: int | None = None
    prefetch_factor: int = 2
    pin_memory: bool | str = "auto"
    persistent_workers: bool = True
    worker_footprint_bytes: int | None = None
    part_images: int | None = None
    timeout_s: float = 0.0

    def __post_init__(self):
        """A request every plan can trust, however it was made (the run's, a re-plan's, a
        test's), refused in the words of the key's rule (``cocodet.schema``)."""
        schema.check("loader.policy", self.policy)
        schema.check("loader.prefetch_factor", self.prefetch_factor)
        if self.policy != "auto" and (self.requested is None or self.requested < 0):
            raise ValueError(f"loader policy {self.policy!r} needs a worker count >= 0, got {self.requested!r}")


@dataclass(frozen=True)
class RecipeShape:
    """What the plan needs of the augment recipe (``run_spec.records.RecipeSpec.shape``): the
    largest image side a train and a val sample can have, mosaic's window partners (0: none)
    and pool, the aspect-ratio grouping ``loader.group_aspect_ratio=preset`` means for it
    (None: off), whether all its outputs are one square (mosaic: grouping is moot), and its
    largest intermediate in bytes."""

    image_size: int
    train_side: int
    val_side: int
    partner_window: int = 0
    partner_pool: int = 0
    partners_from: str | None = None  # mosaic's partner source: "window", "pool" or "dataset" (None: not a mosaic)
    preset_grouping: int | None = None
    square_outputs: bool = False
    working_bytes: int = 0


@dataclass(frozen=True)
class BatchGeometry:
    """The batches the loaders ship: a train batch, a val batch (None: the same as a train
    batch) in images and FlatBatch bytes (``flat_layout.batch_bytes``), and the recipe's
    partner pool (planned parts are a multiple of it when possible, so each part still
    decodes each image once)."""

    batch_size: int
    batch_bytes: int
    val_batch_size: int | None = None
    val_batch_bytes: int | None = None
    partner_pool: int = 0
    image_side: int | None = None  # the largest (padded) image side a train batch may hold
    val_image_side: int | None = None  # the same for a val batch (None: image_side)
    group_aspect_ratio: int | None = None  # train batches from one aspect-ratio bin (loader/grouped_sampler.py)
    group_note: str | None = None  # why a grouping asked for is not applied (mosaic)
    # The recipe's largest intermediate (SSD's zoom-out canvas), added to the worker footprint estimate.
    worker_working_bytes: int = 0
    partner_window: int = 0  # mosaic's window partners (positions; 0: none), which the window cache serves


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
    image_side: int | None = None  # the largest (padded) image side budgeted per image
    timeout_s: float = 0.0  # seconds a batch may take before the loader fails (0: wait forever)
    local_ranks: int = 1  # processes of this run on this host: they share its CPUs, /dev/shm and memory
    ranks_from: str = ""  # where the ranks were read: "torchelastic (rank 1 of 2, node 1)" (cocodet.ranks)
    host_cpus: int | None = None  # this host's CPUs for the run (affinity, quota), before dividing among ranks
    group_aspect_ratio: int | None = None  # train batches from one of 2k+2 aspect-ratio bins (None: not grouped)
    caps: list[WorkerCap] = field(default_factory=list)  # every cap evaluated, in the order evaluated
    warnings: list[str] = field(default_factory=list)
    # The validation loader's plan, made against the same shm budget (None: the same as this plan).
    val: "LoaderPlan | None" = None
    # Bytes of the shm budget each loader may use: its in-flight transfers plus the one its batch
    # or part in the main process holds (the step's batch, a part being joined).
    shm_split: dict | None = None
    # The window cache (loader/plan/window_slots.py): slots, bytes in anonymous shared memory, and why.
    window_slots: int = 0
    window_bytes: int = 0
    window_note: str | None = None

    def for_stage(self, stage: str) -> "LoaderPlan":
        """The plan of the loader named ``stage`` ("val": the validation loader's)."""
        return self.val if stage == "val" and self.val is not None else self

    def reused_buffers(self, stage: str) -> int:
        """Image buffers each worker of the ``stage`` loader keeps to write again
        (``loader/shm_pool.py``): its prefetched transfers and the one the main process holds,
        where the shm budget has room for every worker of both loaders to keep that many;
        0 (a fresh segment each transfer, freed once taken: what the budget counts) where not."""
        plan = self.for_stage(stage)
        if not plan.num_workers or not plan.prefetch_factor:
            return 0
        kept = 0
        for loader in (self, self.val or self):
            if loader.num_workers and loader.prefetch_factor:
                ship = loader.inflight_bytes // (loader.num_workers * loader.prefetch_factor)
                kept += loader.num_workers * (loader.prefetch_factor + 1) * ship
        fits = self.shm_budget_bytes is None or kept <= self.shm_budget_bytes
        return plan.prefetch_factor + 1 if fits else 0

    def dataloader_kwargs(self) -> dict:
        """Arguments for torch's DataLoader; none that PyTorch rejects at num_workers=0.

        Workers are forked, whatever the interpreter's default start method (Python 3.14 on
        Linux defaults to forkserver): the store's per-process state (its counters and give-up
        clock in shared memory, the read-ahead's object cache and budget counter) and the window
        cache's descriptor reach the workers by being inherited. Where fork does not exist, the
        platform's method is used, and those caches are off in the workers (they read directly)."""
        import multiprocessing

        kwargs = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            kwargs.update(
                prefetch_factor=self.prefetch_factor, persistent_workers=self.persistent_workers, timeout=self.timeout_s
            )
            if "fork" in multiprocessing.get_all_start_methods():
                kwargs["multiprocessing_context"] = "fork"
        return kwargs

    def summary(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        """The plan as a small fixed-width table for the log."""
        from cocodet.loader.plan.table import plan_table

        return plan_table(self)

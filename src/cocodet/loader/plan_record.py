"""The loader plan's records (design §3): what the plan is asked (the request, the batch
geometry) and what it decides (``LoaderPlan``, with each cap it evaluated as a ``budget.WorkerCap``).
Plain dataclasses: ``summary()`` is the JSON the run's summary carries."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from cocodet.loader.budget import WorkerCap


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
    worker_working_bytes: int = 0  # the recipe's largest intermediate (SSD's zoom-out canvas), added to the footprint estimate
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
    host_cpus: int | None = None  # this host's CPUs for the run (affinity, quota), before dividing among ranks
    group_aspect_ratio: int | None = None  # train batches from one of 2k+2 aspect-ratio bins (None: not grouped)
    caps: list[WorkerCap] = field(default_factory=list)  # every cap evaluated, in the order evaluated
    warnings: list[str] = field(default_factory=list)
    # The validation loader's plan, made against the same shm budget (None: the same as this plan).
    val: "LoaderPlan | None" = None
    # Bytes of the shm budget each loader may use: its in-flight transfers plus the one its batch
    # or part in the main process holds (the step's batch, a part being joined).
    shm_split: dict | None = None
    # The window cache (loader/window_plan.py): slots, bytes in anonymous shared memory, and why.
    window_slots: int = 0
    window_bytes: int = 0
    window_note: str | None = None

    def for_stage(self, stage: str) -> "LoaderPlan":
        """The plan of the loader named ``stage`` ("val": the validation loader's)."""
        return self.val if stage == "val" and self.val is not None else self

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
            kwargs.update(prefetch_factor=self.prefetch_factor, persistent_workers=self.persistent_workers,
                          timeout=self.timeout_s)
            if "fork" in multiprocessing.get_all_start_methods():
                kwargs["multiprocessing_context"] = "fork"
        return kwargs

    def summary(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        """The plan as a small fixed-width table for the log."""
        from cocodet.loader.plan_reasons import plan_table

        return plan_table(self)

"""run(cfg): turn the composed Hydra config into plain arguments and dispatch on ``cfg.mode``.

This is the only module that reads the config tree; everything below takes typed kwargs.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from cocodet.data.datamodule import CocoDataModule, Split
from cocodet.data.flat_batch import batch_bytes
from cocodet.data.synthetic import ensure_synthetic
from cocodet.loader.policy import LoaderPlan, plan_loader
from cocodet.loader.resources import HostResources, probe, raise_nofile_limit

log = logging.getLogger(__name__)
MODES = ("train", "bench", "plan")


def run_dir_of(cfg: DictConfig) -> Path:
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(cfg.get("run_dir") or os.getcwd())


def cli_overrides() -> list[str]:
    """This run's own command-line overrides (what makes a worker count 'explicit')."""
    if not HydraConfig.initialized():
        return []
    return list(HydraConfig.get().overrides.task)


def build_datamodule(cfg: DictConfig, run_dir: Path) -> CocoDataModule:
    ds = cfg.dataset
    root = Path(ds.root)
    if ds.get("synthetic"):
        ensure_synthetic(root, **OmegaConf.to_container(ds.synthetic))
    elif not root.is_dir():
        raise FileNotFoundError(f"dataset.root={ds.root} not found (resolved to {root.resolve()}); "
                                "point dataset.root at a folder holding the split folders and annotations/")
    return CocoDataModule(
        train=Split(images=str(root / ds.train_images), ann_file=str(root / ds.train_ann)),
        val=Split(images=str(root / ds.val_images), ann_file=str(root / ds.val_ann)),
        image_size=int(ds.image_size), batch_size=int(cfg.loader.batch_size), seed=int(cfg.seed),
        augment=cfg.augment.name, augment_params=OmegaConf.to_container(cfg.augment.params, resolve=True),
        val_batch_size=cfg.loader.get("val_batch_size"), keep_empty=bool(ds.keep_empty),
        on_bad_sample=ds.on_bad_sample, run_dir=str(run_dir),
    )


def uses_cuda(cfg: DictConfig) -> bool:
    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def ranks_per_host(cfg: DictConfig) -> int:
    """Processes this run starts on this host (they share its CPUs and /dev/shm)."""
    devices = cfg.trainer.get("devices", 1)
    if isinstance(devices, int) and devices > 0:
        return devices
    if devices in (-1, "auto", "-1") and uses_cuda(cfg):
        return max(1, torch.cuda.device_count())
    return len(devices) if isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices) else 1


def worker_request(loader: DictConfig, overrides: list[str], environ: dict) -> tuple[str, int | None]:
    """Resolve (policy, requested count) per DESIGN §3.

    A count named on this run's command line is explicit. A count that arrives any other way
    (a preset/experiment file, or a scheduler variable for loader=inherited) is inherited.
    """
    policy, requested = str(loader.policy), loader.get("num_workers")
    named_here = any(o.lstrip("+~").split("=", 1)[0] == "loader.num_workers" for o in overrides)
    if policy == "explicit":
        if requested is None:
            raise ValueError("loader=explicit needs a count: add loader.num_workers=N (or use loader=auto)")
        return "explicit", int(requested)
    if policy == "auto":
        if requested is None:
            return "auto", None
        return ("explicit" if named_here else "inherited"), int(requested)
    if policy == "inherited":
        if named_here:
            return "explicit", int(requested)
        for var in loader.get("inherit_from", []):
            value = environ.get(var, "")
            if value.strip().isdigit():
                log.info("inherited worker count %s from $%s", value, var)
                return "inherited", int(value)
        if requested is not None:
            return "inherited", int(requested)
        raise ValueError(f"loader=inherited found no count: none of ${', $'.join(loader.get('inherit_from', []))} "
                         "is set and loader.num_workers is null. Set one of them, or use loader=auto")
    raise ValueError(f"unknown loader.policy {policy!r}; choose auto, explicit or inherited")


def build_plan(cfg: DictConfig, resources: HostResources) -> LoaderPlan:
    policy, requested = worker_request(cfg.loader, cli_overrides(), dict(os.environ))
    footprint_mb = cfg.loader.get("worker_footprint_mb")
    return plan_loader(
        policy, requested, batch_size=int(cfg.loader.batch_size),
        batch_bytes=batch_bytes(int(cfg.loader.batch_size), int(cfg.dataset.image_size)),
        prefetch_factor=int(cfg.loader.prefetch_factor), resources=resources, cuda=uses_cuda(cfg),
        pin_memory=cfg.loader.pin_memory, persistent_workers=bool(cfg.loader.persistent_workers),
        worker_footprint_bytes=int(footprint_mb) << 20 if footprint_mb else None,
    )


def write_summary(run_dir: Path, summary: dict) -> None:
    """summary.json in the run dir, and the same object as the last line on stdout (DESIGN §2)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(summary, default=str)
    (run_dir / "summary.json").write_text(text + "\n")
    sys.stdout.flush()
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def run(cfg: DictConfig) -> dict:
    if cfg.mode not in MODES:
        raise ValueError(f"unknown mode {cfg.mode!r}; choose one of {MODES}")
    run_dir = run_dir_of(cfg)
    raise_nofile_limit()
    resources = probe(shm_path=str(cfg.loader.shm_path), ranks_per_host=ranks_per_host(cfg))
    datamodule = build_datamodule(cfg, run_dir)
    plan = build_plan(cfg, resources)
    datamodule.set_plan(plan)
    log.info("loader plan:\n%s", plan.table())
    for warning in plan.warnings:
        log.warning("loader plan: %s", warning)
    if cfg.dataset.get("verify"):
        from cocodet.data.verify import verify_datamodule

        verify_datamodule(datamodule, run_dir)
    if cfg.mode == "plan":
        log.info("host preflight:\n%s", resources.table())
        summary = {"mode": "plan", **plan.summary(), "host": resources.as_dict()}
    elif cfg.mode == "bench":
        summary = bench(cfg, datamodule, plan)
    else:
        summary = train(cfg, datamodule, plan, run_dir)
    write_summary(run_dir, summary)
    return summary


def build_module(cfg: DictConfig, datamodule: CocoDataModule):
    from hydra.utils import instantiate

    from cocodet.models.detector import DetectorModule
    from cocodet.models.zoo import build_detector

    m = cfg.model
    model = build_detector(m.name, num_classes=datamodule.num_classes, image_size=int(cfg.dataset.image_size),
                           pretrained=bool(m.pretrained), pretrained_backbone=bool(m.pretrained_backbone),
                           **OmegaConf.to_container(m.kwargs, resolve=True))
    return DetectorModule(
        model, optimizer=instantiate(m.optimizer), scheduler=instantiate(m.scheduler) if m.get("scheduler") else None,
        scheduler_interval=m.get("scheduler_interval", "step"), val_ann_file=datamodule.val_ann_file,
        category_ids=datamodule.train_index.category_ids.tolist(),
    )


def train(cfg: DictConfig, datamodule: CocoDataModule, plan: LoaderPlan, run_dir: Path) -> dict:
    import time

    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from cocodet.bench.callback import LoaderTimingCallback
    from cocodet.loader.diagnose import explained_loader_failures

    from cocodet.models.precision import resolve_precision

    L.seed_everything(int(cfg.seed), workers=False, verbose=False)  # model init; data has its own generators
    module = build_module(cfg, datamodule)
    trainer_args = OmegaConf.to_container(cfg.trainer, resolve=True)
    trainer_args["precision"] = resolve_precision(trainer_args.get("precision", "32-true"))
    checkpoint = ModelCheckpoint(dirpath=run_dir / "checkpoints", filename="best-{epoch:03d}", monitor="val/map",
                                 mode="max", save_top_k=1, save_last=True, auto_insert_metric_name=False)
    timing = LoaderTimingCallback()
    trainer = L.Trainer(
        **trainer_args, default_root_dir=str(run_dir),
        callbacks=[checkpoint, LearningRateMonitor(logging_interval="step"), timing],
        logger=[CSVLogger(run_dir, name="csv"), TensorBoardLogger(run_dir, name="tensorboard")],
    )
    started = time.perf_counter()
    with explained_loader_failures(plan, shm_path=str(cfg.loader.shm_path)):
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"),
                    weights_only=bool(cfg.get("weights_only", False)) if cfg.get("ckpt_path") else None)
    metrics = module.last_metrics or {}
    best = checkpoint.best_model_score
    return {
        "mode": "train",
        **{k: round(float(metrics.get(k, 0.0)), 4) for k in ("map", "map50", "map75", "map_small", "map_medium", "map_large")},
        "best_map": round(float(best), 4) if best is not None else None,
        "epochs": int(trainer.current_epoch),
        "steps": int(trainer.global_step),
        "wall_s": round(time.perf_counter() - started, 1),
        "last_ckpt": checkpoint.last_model_path or None,
        "best_ckpt": checkpoint.best_model_path or None,
        "loader_wait": timing.summary(),
        "bad_samples": datamodule.bad_sample_summary(),
        "precision": trainer_args["precision"],
        "plan": plan.summary(),
    }


def bench(cfg: DictConfig, datamodule: CocoDataModule, plan: LoaderPlan) -> dict:
    from cocodet.bench.run import run_bench
    from cocodet.loader.diagnose import explained_loader_failures
    from cocodet.models.precision import resolve_precision

    b = cfg.bench
    train_step = None
    device = torch.device("cuda" if uses_cuda(cfg) and torch.cuda.is_available() else "cpu")
    precision = resolve_precision(cfg.trainer.get("precision", "32-true"))
    if b.consumer == "model":
        train_step = model_train_step(cfg, datamodule, device, precision)
    with explained_loader_failures(plan, shm_path=str(cfg.loader.shm_path)):
        summary = run_bench(
            datamodule, plan, consumer=b.consumer, work_ms=float(b.work_ms), batches=b.batches, warmup=int(b.warmup),
            epochs=int(b.epochs), digest_batches=int(b.digest_batches), producer=b.producer,
            producer_ms=float(b.producer_ms), producer_samples=int(b.producer_samples),
            decode_probe_images=int(b.decode_probe), shm_path=str(cfg.loader.shm_path), train_step=train_step,
            device=device, preload=bool(b.get("preload", False)))
    return {**summary, "precision": precision if b.consumer == "model" else None}


def model_train_step(cfg: DictConfig, datamodule: CocoDataModule, device: torch.device, precision: str):
    """The configured detector's real training step (restore, forward, backward, step) on a
    batch already on ``device``, under the run's mixed precision."""
    from cocodet.data.flat_batch import restore

    module = build_module(cfg, datamodule).to(device)
    module.train()
    optimizer = module.optimizer_factory(params=[p for p in module.parameters() if p.requires_grad])
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    autocast = device.type == "cuda" and dtype is not None
    scaler = torch.amp.GradScaler("cuda", enabled=autocast and dtype == torch.float16)

    def step(batch) -> None:
        images, targets = restore(batch)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=autocast):
            loss = sum(module.model(images, targets).values())
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    return step

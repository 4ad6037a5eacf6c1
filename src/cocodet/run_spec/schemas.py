"""The closed config groups' schemas: Hydra structured configs (dataclasses in the ConfigStore).

Each group's YAML names its schema first in its defaults list (``- /schemas/<group>@_here_``:
a group of its own, so the schema is never offered as one of the group's options), so composing a
config checks every key's type, and each choice against its options, before the run starts:
a key the group does not declare, ``loader.batch_size=abc`` or ``loader.policy=fast`` fail at
composition (``cli`` words them with the rule of ``schema.py`` where one exists). The values
and their comments stay in the YAML; here are the types only (``MISSING``: the YAML sets it).
The choices come from ``schema.py``'s lists, so each is written once.

What a dataclass cannot express stays in ``schema.RULES``, checked by ``run_spec/validate.py``: ranges
(``batch_size >= 1``), and the keys a ``+`` override appends (Hydra lets ``+group.key=value``
past a structured config; ``run_spec/validate.py`` refuses a key its group's schema lacks). The
groups users extend stay open: ``trainer``, ``model``, ``callbacks``, ``logger``, ``augment``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, List, Optional

from omegaconf import MISSING

from cocodet import schema


def choices(name: str, options: tuple) -> type[Enum]:
    """A str enum whose members are ``options`` (name and value alike)."""
    return Enum(name, {str(o): o for o in options}, type=str)


LoaderPolicy = choices("LoaderPolicy", schema.LOADER_POLICIES)
OnFailure = choices("OnFailure", schema.ON_FAILURE)
BenchConsumer = choices("BenchConsumer", schema.BENCH_CONSUMERS)
BenchProducer = choices("BenchProducer", schema.BENCH_PRODUCERS)
EvalSplit = choices("EvalSplit", schema.EVAL_SPLITS)
ExportFormat = choices("ExportFormat", schema.EXPORT_FORMATS)


@dataclass
class LoaderSchema:
    policy: LoaderPolicy = MISSING
    num_workers: Optional[int] = MISSING
    batch_size: int = MISSING
    val_batch_size: Optional[int] = MISSING
    prefetch_factor: int = MISSING
    part_images: Optional[int] = MISSING
    pin_memory: Any = MISSING  # auto, true or false
    on_failure: Optional[OnFailure] = MISSING
    max_replans: int = MISSING
    timeout: float = MISSING
    persistent_workers: bool = MISSING
    shm_path: str = MISSING
    worker_footprint_mb: Optional[int] = MISSING
    inherit_from: List[str] = MISSING
    group_aspect_ratio: Any = MISSING  # preset, an integer, or null


@dataclass
class BenchSchema:
    consumer: BenchConsumer = MISSING
    work_ms: float = MISSING
    batches: Optional[int] = MISSING
    warmup: int = MISSING
    epochs: int = MISSING
    digest_batches: int = MISSING
    producer: BenchProducer = MISSING
    producer_ms: float = MISSING
    producer_samples: int = MISSING
    decode_probe: int = MISSING
    preload: bool = MISSING


@dataclass
class EvalSchema:
    split: EvalSplit = MISSING


@dataclass
class PredictSchema:
    source: Optional[str] = MISSING
    score_threshold: float = MISSING
    draw: bool = MISSING


@dataclass
class ExportSchema:
    format: ExportFormat = MISSING
    opset: int = MISSING


@dataclass
class PreviewSchema:
    batches: int = MISSING
    epoch: int = MISSING


SCHEMAS = {
    "loader": LoaderSchema,
    "bench": BenchSchema,
    "eval": EvalSchema,
    "predict": PredictSchema,
    "export": ExportSchema,
    "preview": PreviewSchema,
}


def declared_keys(group: str) -> tuple[str, ...] | None:
    """The keys ``group``'s schema declares (None: an open group)."""
    node = SCHEMAS.get(group)
    return tuple(f.name for f in fields(node)) if node is not None else None


def register() -> None:
    """Each schema as ``schemas/<group>`` in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for group, node in SCHEMAS.items():
        store.store(group="schemas", name=group, node=node)

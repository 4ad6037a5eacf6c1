"""Config validation, once, at start: every user-settable value the code relies on, its type and range.

Hydra composes strings, numbers and nulls without knowing what they mean; a negative batch
size or ``image_size=0`` would otherwise fail deep inside a library (or not at all). Each
rule names the key, the value and what is allowed, in one line a user can act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf



from cocodet.errors import ConfigError, UserError  # noqa: F401  (UserError: what cli catches)
from cocodet.modes import MODES


@dataclass(frozen=True)
class Rule:
    key: str
    check: Callable[[Any], bool]
    allowed: str
    optional: bool = False


def _int(lo: int | None = None) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and (lo is None or v >= lo)
    return check


def _number(lo: float, hi: float | None = None) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)
    return check


def _one_of(*options: Any) -> Callable[[Any], bool]:
    return lambda v: v in options


RULES = (
    Rule("mode", _one_of(*MODES), "one of " + ", ".join(MODES)),
    Rule("seed", _int(0), "an integer >= 0"),
    Rule("dataset.root", lambda v: isinstance(v, str) and bool(v), "a folder path"),
    Rule("dataset.image_size", _int(32), "an integer >= 32 (pixels of the letterboxed side)"),
    Rule("dataset.on_bad_sample", _one_of("raise", "skip"), "raise or skip"),
    Rule("dataset.keep_empty", _one_of(True, False), "true or false"),
    Rule("dataset.cache", _one_of("none", "ram", "disk"), "none, ram or disk"),
    Rule("loader.policy", _one_of("auto", "explicit", "inherited"), "auto, explicit or inherited"),
    Rule("loader.batch_size", _int(1), "an integer >= 1"),
    Rule("loader.val_batch_size", _int(1), "an integer >= 1, or null for batch_size", optional=True),
    Rule("loader.num_workers", _int(0), "an integer >= 0, or null for the policy's own count", optional=True),
    Rule("loader.prefetch_factor", _int(1), "an integer >= 1"),
    Rule("loader.on_failure", _one_of("replan", "raise"), "replan or raise, or null for the policy's default",
         optional=True),
    Rule("loader.max_replans", _int(0), "an integer >= 0"),
    Rule("loader.timeout", _number(0.0), "seconds >= 0 (0: no timeout)"),
    Rule("loader.part_images", _int(1), "an integer >= 1, or null to ship whole batches when they fit", optional=True),
    Rule("loader.pin_memory", _one_of("auto", True, False), "auto, true or false"),
    Rule("loader.worker_footprint_mb", _int(1), "an integer >= 1 (MiB), or null for the estimate", optional=True),
    Rule("eval.split", _one_of("val", "train"), "val or train"),
    Rule("predict.score_threshold", _number(0.0, 1.0), "a score in [0, 1]"),
    Rule("predict.draw", _one_of(True, False), "true or false"),
    Rule("export.format", _one_of("torchscript", "onnx"), "torchscript or onnx"),
    Rule("export.opset", _int(9), "an ONNX opset >= 9"),
    Rule("checkpoint.every_n_steps", _int(0), "an integer >= 0 (0: checkpoints at epoch ends only)"),
    Rule("bench.batches", _int(1), "an integer >= 1, or null for whole epochs", optional=True),
    Rule("bench.warmup", _int(0), "an integer >= 0"),
    Rule("bench.epochs", _int(1), "an integer >= 1"),
    Rule("bench.consumer", _one_of("none", "spin", "sleep", "model"), "none, spin, sleep or model"),
    Rule("bench.producer", _one_of("dataset", "sleep", "spin"), "dataset, sleep or spin"),
    Rule("bench.work_ms", _number(0.0), "a number >= 0"),
    Rule("bench.decode_probe", _int(0), "an integer >= 0"),
    Rule("model.optimizer.lr", _number(1e-12), "a learning rate > 0"),
    Rule("model.eval_max_images", _int(1), "an integer >= 1, or null for every val image", optional=True),
    Rule("augment.flip_p", _number(0.0, 1.0), "a probability in [0, 1]", optional=True),
    Rule("augment.mosaic_p", _number(0.0, 1.0), "a probability in [0, 1]", optional=True),
    Rule("augment.partner_pool", _int(2), "an integer >= 2", optional=True),
    Rule("augment.translate", _number(0.0, 1.0), "a fraction of the image side in [0, 1]", optional=True),
    Rule("augment.min_visibility", _number(0.0, 1.0), "a fraction in [0, 1]", optional=True),
)


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError for the first value outside its rule (keys absent from this config are skipped)."""
    for rule in RULES:
        value = OmegaConf.select(cfg, rule.key, default=_ABSENT, throw_on_missing=False)
        if value is _ABSENT or (value is None and rule.optional):
            continue
        if not rule.check(value):
            raise ConfigError(f"{rule.key}={_show(value)} is not allowed: expected {rule.allowed}")
    scale = OmegaConf.select(cfg, "augment.scale", default=None)
    if scale is not None and not (len(scale) == 2 and all(_number(0.05)(s) for s in scale) and scale[0] <= scale[1]):
        raise ConfigError(f"augment.scale={_show(list(scale))} is not allowed: expected [low, high] with 0.05 <= low <= high")


_ABSENT = object()


def _show(value: Any) -> str:
    if isinstance(value, (DictConfig,)) or OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    return repr(value) if isinstance(value, str) else str(value).replace("True", "true").replace("False", "false").replace("None", "null")

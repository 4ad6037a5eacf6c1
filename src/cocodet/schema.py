"""Every user-settable rule, written once (bottom layer: no omegaconf, no Hydra, no torch).

``run_spec/validate.py`` checks a composed config against :data:`RULES` at start; constructors
that take the same values from code check them with :func:`check`, against the same rule, so
no choice list or range is written twice. A value outside its rule is a :class:`ConfigError`
that names the key, the value and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from cocodet.errors import ConfigError

# The modes train.py runs (``modes/__init__.py`` maps each to its function).
MODES = ("train", "bench", "plan", "preview", "eval", "predict", "export", "verify")
LOADER_POLICIES = ("auto", "explicit", "inherited")
ON_BAD_SAMPLE = ("raise", "skip")
ON_FAILURE = ("replan", "raise")
CACHE_MODES = ("none", "ram", "disk")
BENCH_CONSUMERS = ("none", "spin", "sleep", "model")
BENCH_PRODUCERS = ("dataset", "sleep", "spin")
EVAL_SPLITS = ("val", "train")
EXPORT_FORMATS = ("torchscript", "onnx")
EVAL_BACKENDS = ("faster", "pycocotools")
ON_COLLAPSE = ("warn", "stop")
PARTNERS = ("window", "pool", "dataset")  # where mosaic partners come from (transforms/augment.py)
COLOUR_MODES = ("matrix", "hsv")  # mosaic's colour jitter (transforms/colour.py)

# The dataset group's keys every layout shares: the CocoDataModule arguments a config gives (its
# runtime arguments, the recipe, plan, batch sizes, seed and run dir, come from other groups), the
# split loader's, and storage_options, which configure the store (run_spec.StorageSpec). Each
# layout's own keys and rules are its entry's in the layout table (datasets/layouts.py). A key
# outside these is refused in every mode, so a typo cannot pass mode=plan and end another mode in
# a TypeError (tests/test_config.py keeps them equal to the constructors' signatures).
DATASET_KEYS = (
    "_target_",
    "root",
    "image_size",
    "keep_empty",
    "on_bad_sample",
    "verify",
    "cache_dir",
    "cache",
    "max_image_pixels",
    "storage_options",
    "remote",
    "layout",
)


@dataclass(frozen=True)
class Rule:
    key: str
    check: Callable[[Any], bool]
    allowed: str
    optional: bool = False  # null is allowed (it means what ``allowed`` says)

    def validate(self, value: Any) -> None:
        if value is None and self.optional:
            return
        if not self.check(value):
            raise ConfigError(f"{self.key}={show(value)} is not allowed: expected {self.allowed}")


def _int(lo: int | None = None) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and (lo is None or v >= lo)

    return check


def _number(lo: float, hi: float | None = None) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)

    return check


def _scale(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) == 2 and all(_number(0.05)(s) for s in v) and v[0] <= v[1]


def _jitter(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) == 2 and all(_number(0.01)(s) for s in v) and v[0] <= v[1]


def _gains(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) == 2 and all(_number(0.0)(g) for g in v) and v[0] <= v[1]


def _sides(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(_int(32)(s) for s in v)


def _one_of(options: tuple) -> tuple[Callable[[Any], bool], str]:
    words = [str(o).lower() if isinstance(o, bool) else str(o) for o in options]
    return (lambda v: any(v == o and type(v) is type(o) for o in options)), (
        ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]
    )


def _choice(key: str, options: tuple, optional_means: str | None = None) -> Rule:
    check, allowed = _one_of(options)
    if optional_means:
        allowed += f", or null {optional_means}"
    return Rule(key, check, allowed, optional=optional_means is not None)


_BOOL = (True, False)
RULES = (
    Rule("seed", _int(0), "an integer >= 0"),
    Rule("dataset.root", lambda v: isinstance(v, str) and bool(v), "a folder path or a URL (s3://bucket/prefix)"),
    Rule("dataset.storage_options", lambda v: isinstance(v, dict), "a mapping of fsspec options", optional=True),
    Rule("dataset.remote.timeout_s", _number(0.1), "seconds > 0 (the longest wait for one request to the store)"),
    Rule("dataset.remote.retries", _int(0), "an integer >= 0 (retries of a failed request, at least)"),
    Rule("dataset.remote.give_up_s", _number(0.0), "seconds >= 0 (how long a failing request is retried, at least)"),
    Rule(
        "dataset.remote.cache_bytes",
        lambda v: v == "auto" or _int(0)(v),
        "auto (half the free disk where the copies go, at most 4 GiB) or bytes >= 0 (the read-ahead's budget; "
        "0: no read-ahead)",
    ),
    Rule("dataset.remote.concurrency", _int(1), "an integer >= 1 (GETs in flight)"),
    Rule("dataset.image_size", _int(32), "an integer >= 32 (pixels of the letterboxed side)"),
    _choice("dataset.on_bad_sample", ON_BAD_SAMPLE),
    _choice(
        "dataset.keep_empty",
        (True, False, "reference"),
        "for the recipe's default (true; reference with augment=hflip|multiscale|lsj)",
    ),
    _choice("dataset.cache", CACHE_MODES),
    Rule("dataset.max_image_pixels", _int(1), "an integer >= 1 (pixels of the largest image read)"),
    _choice("loader.policy", LOADER_POLICIES),
    Rule("loader.batch_size", _int(1), "an integer >= 1"),
    Rule("loader.val_batch_size", _int(1), "an integer >= 1, or null for batch_size", optional=True),
    Rule("loader.num_workers", _int(0), "an integer >= 0, or null for the policy's own count", optional=True),
    Rule("loader.prefetch_factor", _int(1), "an integer >= 1"),
    _choice("loader.on_failure", ON_FAILURE, "for the policy's default"),
    Rule("loader.max_replans", _int(0), "an integer >= 0"),
    Rule("loader.timeout", _number(0.0), "seconds >= 0 (0: no timeout)"),
    Rule("loader.part_images", _int(1), "an integer >= 1, or null to ship whole batches when they fit", optional=True),
    _choice("loader.pin_memory", ("auto", True, False)),
    Rule(
        "loader.group_aspect_ratio",
        lambda v: v == "preset" or _int(1)(v),
        "an integer >= 1 (the reference's group factor k: 2k+2 bins), preset (3 with a reference preset), "
        "or null (not grouped)",
        optional=True,
    ),
    Rule("loader.worker_footprint_mb", _int(1), "an integer >= 1 (MiB), or null for the estimate", optional=True),
    _choice("eval.split", EVAL_SPLITS),
    Rule("predict.score_threshold", _number(0.0, 1.0), "a score in [0, 1]"),
    _choice("predict.draw", _BOOL),
    _choice("export.format", EXPORT_FORMATS),
    Rule("export.opset", _int(9), "an ONNX opset >= 9"),
    Rule(
        "checkpoint.dir",
        lambda v: isinstance(v, str) and bool(v),
        "a folder path or a bucket folder (s3://bucket/prefix)",
    ),
    Rule("checkpoint.storage_options", lambda v: isinstance(v, dict), "a mapping of fsspec options", optional=True),
    Rule(
        "checkpoint.every_n_steps",
        lambda v: v == "auto" or _int(0)(v),
        "auto (500 on several nodes or under torchrun restarts, else 0) or an integer >= 0 (0: checkpoints at epoch "
        "ends and on SIGTERM only)",
    ),
    _choice("weights_only", _BOOL),
    Rule(
        "optimized_metric",
        lambda v: isinstance(v, str) and v.isidentifier(),
        "auto (map50 for mode=train and eval, examples_per_s for bench) or a numeric top-level summary key",
    ),
    _choice("optimized_direction", ("auto", "maximize", "minimize")),
    Rule("bench.batches", _int(1), "an integer >= 1, or null for whole epochs", optional=True),
    Rule("bench.warmup", _int(0), "an integer >= 0"),
    Rule("bench.epochs", _int(1), "an integer >= 1"),
    _choice("bench.consumer", BENCH_CONSUMERS),
    _choice("bench.producer", BENCH_PRODUCERS),
    Rule("bench.work_ms", _number(0.0), "a number >= 0"),
    Rule("bench.decode_probe", _int(0), "an integer >= 0"),
    Rule("model.optimizer.lr", _number(1e-12), "a learning rate > 0"),
    Rule("model.eval_max_images", _int(1), "an integer >= 1, or null for every val image", optional=True),
    _choice("model.eval_backend", EVAL_BACKENDS),
    Rule(
        "model.health.max_nonfinite_steps", _int(1), "an integer >= 1 (non-finite steps in a row before the run stops)"
    ),
    Rule("model.health.flat_steps", _int(2), "an integer >= 2 (steps a loss term may stay at one value)"),
    _choice("model.health.on_collapse", ON_COLLAPSE),
    Rule("model.ema.decay", _number(0.0, 0.999999), "a decay in [0, 1), or null for no EMA weights", optional=True),
    Rule("augment.flip_p", _number(0.0, 1.0), "a probability in [0, 1]", optional=True),
    Rule("augment.mosaic_p", _number(0.0, 1.0), "a probability in [0, 1]", optional=True),
    Rule(
        "augment.partner_pool", _int(2), "an integer >= 2, or null for partners from the whole dataset", optional=True
    ),
    _choice(
        "augment.partners",
        PARTNERS,
        optional_means="(decided by augment.partner_pool: an integer means pools, null the whole dataset)",
    ),
    Rule(
        "augment.partner_window",
        _int(2),
        "an integer >= 2 (positions of the epoch order partners come from)",
        optional=True,
    ),
    _choice("augment.colour", COLOUR_MODES),
    Rule("augment.hue_deg", _number(0.0, 180.0), "degrees in [0, 180] (the largest hue rotation either way)"),
    Rule("augment.saturation", _gains, "[low, high] gains with 0 <= low <= high (1: unchanged)"),
    Rule("augment.value", _gains, "[low, high] gains with 0 <= low <= high (1: unchanged)"),
    Rule("augment.translate", _number(0.0, 1.0), "a fraction of the image side in [0, 1]", optional=True),
    Rule("augment.min_visibility", _number(0.0, 1.0), "a fraction in [0, 1]", optional=True),
    Rule("augment.scale", _scale, "[low, high] with 0.05 <= low <= high", optional=True),
    Rule("augment.scale_range", _jitter, "[low, high] with 0.01 <= low <= high (lsj's jitter factors)", optional=True),
    Rule("augment.min_sizes", _sides, "a list of shorter sides (integers >= 32)", optional=True),
    Rule("augment.max_size", _int(32), "an integer >= 32 (the longer side's limit)", optional=True),
    Rule("augment.size", _int(32), "an integer >= 32 (lsj's output side)", optional=True),
)
_BY_KEY = {rule.key: rule for rule in RULES}


def check(key: str, value: Any) -> Any:
    """Raise ConfigError unless ``value`` is allowed for ``key``; return it (for constructors)."""
    _BY_KEY[key].validate(value)
    return value


def show(value: Any) -> str:
    """A value as the user would type it in an override."""
    if isinstance(value, str):
        return repr(value)
    return str(value).replace("True", "true").replace("False", "false").replace("None", "null")

"""Which mixed precision a GPU run uses (``trainer.precision=auto-mixed``, the ``trainer=gpu`` default)."""

from __future__ import annotations

import torch

AUTO = "auto-mixed"


def choose_precision(requested: str, cuda_available: bool, bf16_supported: bool) -> str:
    """Resolve ``auto-mixed``: bf16 where the GPU has it (Ampere and newer: no loss scaling,
    fp32's exponent range), else fp16 with a GradScaler; on a host without CUDA, 32-bit.
    Any other value is Lightning's own and passes through."""
    if str(requested) != AUTO:
        return requested
    if not cuda_available:
        return "32-true"
    return "bf16-mixed" if bf16_supported else "16-mixed"


def resolve_precision(requested: str) -> str:
    """:func:`choose_precision` for this host."""
    cuda = torch.cuda.is_available()
    return choose_precision(requested, cuda, cuda and torch.cuda.is_bf16_supported())


def cpu_fp16_plugin(precision: str, accelerator: str | None):
    """``trainer.precision=16-mixed`` on the CPU, kept as asked: Lightning would replace it with
    bf16-mixed (a warning, then no GradScaler), so the fp16 path (loss scaling, the scaler's
    own skipped steps, design §12) could never be rehearsed without a GPU. torch runs fp16
    autocast and a GradScaler on the CPU; this is Lightning's own plugin with them. None where
    Lightning's choice stands (a GPU, another precision)."""
    if str(precision) != "16-mixed":
        return None
    on_cpu = str(accelerator) == "cpu" or (str(accelerator) in ("auto", "None") and not torch.cuda.is_available())
    if not on_cpu:
        return None
    from lightning.pytorch.plugins.precision import MixedPrecision

    return MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))

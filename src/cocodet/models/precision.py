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

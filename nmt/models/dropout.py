"""Dropout whose random mask costs a quarter of the random numbers on the CPU.

``F.dropout`` on a CPU draws one random number per element (``bernoulli_``), and on a
Multi30k batch that drawing took longer than the matrix products of the layer it follows. Here
one 64-bit random word gives the mask of four elements: it is split into four 16-bit lanes,
and an element is dropped when its lane falls below ``round(p * 65536)``. Each lane is uniform
over 65,536 values, so an element is dropped with probability ``round(p * 65536) / 65536``
(0.100006 for p = 0.1) and independently of the others; the kept ones are scaled by the
inverse of the keep probability, so the expected output equals the input, as with
``F.dropout``.

Elsewhere (a GPU, whose fused dropout kernel is already fast, or code that ``torch.compile``
traces) it is ``F.dropout`` itself. The random words come from PyTorch's generator, so
``torch.manual_seed`` and a checkpoint's saved random state decide the masks as they decide
``F.dropout``'s.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LANES = 1 << 16  # values of a 16-bit lane
LANES_PER_WORD = 4


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> tuple[Tensor, float]:
    """A random boolean mask of ``shape``, True where an element is kept, and the scale of the
    kept elements: 1 / their probability. ``round(p * 65536) < 65536``."""
    count = shape.numel()
    words = torch.empty(-(-count // LANES_PER_WORD), dtype=torch.int64, device=device)
    words.random_(torch.iinfo(torch.int64).min, None)  # all 64 bits uniform
    lanes = words.view(torch.int16)[:count].view(shape)  # uniform over [-32768, 32767]
    dropped = round(p * LANES)
    return lanes >= torch.iinfo(torch.int16).min + dropped, LANES / (LANES - dropped)


class _Masked(torch.autograd.Function):
    """x * keep * scale, with the boolean mask (one byte an element) kept for the backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, keep: Tensor, scale: float) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


def reference_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Dropout as defined: each element is zeroed with probability ``p`` and the kept ones are
    scaled by 1 / (1 - p), so that the expectation is ``x``; the identity outside training.
    PyTorch's ``F.dropout``, which :func:`dropout` equals in distribution."""
    return F.dropout(x, p, training)


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """``F.dropout(x, p, training)``, with the mask of :func:`keep_mask` on the CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or round(p * LANES) >= LANES or torch.compiler.is_compiling():
        return F.dropout(x, p, training)
    keep, scale = keep_mask(x.shape, p, x.device)
    return _Masked.apply(x, keep, scale)


class Dropout(nn.Module):
    """``nn.Dropout`` (no parameters, the same ``p``), computed by :func:`dropout`."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"

"""The vocabulary projection and its cross-entropy in one pass, a block of tokens at a time.

Training scores N target tokens against a vocabulary of V entries. Projecting all of them at
once makes an N x V logit tensor (3,500 x 8,000 in a Multi30k batch: 112 MB in fp32), and the
loss and its backward pass read and write tensors of that size several times: the cast to
fp32, log-softmax, its gradient, the cast back. On a CPU that traffic costs more than the
matrix products themselves.

:func:`projected_cross_entropy` instead takes the features (N, D) before the projection and
works through them a block of rows at a time, small enough to stay in cache. For each block it
computes the logits, the loss, and at once the gradient of the loss with respect to the
logits, ``softmax(z) - q`` where ``q`` is the label-smoothed target distribution; the block's
share of the gradients of the features, the weight and the bias follows from two matrix
products. The backward pass only scales those stored gradients by the incoming one. No N x V
tensor is ever built, and the result equals ``F.cross_entropy(F.linear(x, weight, bias),
targets, label_smoothing=..., reduction="sum")`` and its gradients, to rounding.

Under autocast the products run in the autocast dtype (as ``F.linear`` would) and the softmax
in fp32 (as the loss on ``logits.float()`` did).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.models.compile_exclusion import compile_excluded


def reference_cross_entropy(
    x: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, label_smoothing: float = 0.0
) -> Tensor:
    """The definition :func:`projected_cross_entropy` computes: project the features ``x``
    (N, D) onto the vocabulary (``weight`` (V, D), ``bias`` (V,) or None), and sum the
    label-smoothed cross-entropy of the N ``targets``, in fp32.

    With smoothing s, the target distribution puts 1 - s + s/V on the reference token and s/V
    on every other; the loss of a token is -sum_v q_v log softmax(z)_v. This builds the N x V
    logits: the tests' oracle, and the plain version for a reader.
    """
    logits = F.linear(x, weight, bias)  # (N, V)
    return F.cross_entropy(
        logits.float(), targets, label_smoothing=label_smoothing, reduction="sum"
    )


# elements of one block's fp32 logits: 2 M (8 MB) keeps a block in a CPU core's cache; a GPU
# is served better by fewer, larger products
BLOCK_ELEMENTS = {"cpu": 1 << 21}
DEFAULT_BLOCK_ELEMENTS = 1 << 26
# rows a block has at least, where a block of them stays under MAX_BLOCK_ELEMENTS: with a large
# vocabulary the cache budget alone gives a few dozen rows (36 for OPUS-MT's 58,101), products
# too thin to run at the machine's speed, and the weight's gradient, added to once per block,
# is read and written that many times. Measured on a 2-core CPU, 1,600 tokens of width 512 and
# 58,101 classes in fp32: 4.4 s at 36 rows, 1.7 s at 512; and at 8,000 classes 512 rows are no
# slower than 262.
MIN_BLOCK_ROWS = 512
MAX_BLOCK_ELEMENTS = 1 << 27


def block_rows(vocab: int, device: torch.device) -> int:
    """Rows per block: as many as fit the device's budget of logit elements, but at least
    MIN_BLOCK_ROWS where those fit MAX_BLOCK_ELEMENTS; at least 1."""
    vocab = max(vocab, 1)
    budget = BLOCK_ELEMENTS.get(device.type, DEFAULT_BLOCK_ELEMENTS)
    return max(1, budget // vocab, min(MIN_BLOCK_ROWS, MAX_BLOCK_ELEMENTS // vocab))


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype ``F.linear`` would run in here: autocast's where it is on, else ``x``'s."""
    kind = x.device.type
    if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return x.dtype


class _ProjectedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy of ``x @ weight.T + bias``; see the module doc."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        label_smoothing: float,
        rows: int,
        dtype: torch.dtype,
        grads: bool,
    ) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):  # dtypes chosen by the caller
            # needs_input_grad follows requires_grad alone, also under no_grad and
            # inference_mode; ``grads`` says whether autograd was recording at the call
            need_x, need_w = grads and ctx.needs_input_grad[0], grads and ctx.needs_input_grad[1]
            need_b = grads and bias is not None and ctx.needs_input_grad[2]
            vocab = weight.size(0)
            on = 1.0 - label_smoothing  # the weight of the reference token in q
            spread = label_smoothing / vocab  # the weight of every token in q
            w, xs = weight.to(dtype), x.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            f32 = {"dtype": torch.float32, "device": x.device}
            grad_x = torch.empty(x.shape, **f32) if need_x else None
            grad_w = torch.zeros(weight.shape, **f32) if need_w else None
            grad_b = torch.zeros(vocab, **f32) if need_b else None
            total = torch.zeros((), dtype=torch.float64, device=x.device)
            for start in range(0, x.size(0), rows):
                xb, tb = xs[start : start + rows], targets[start : start + rows]  # (n, D), (n,)
                z = xb @ w.t() if b is None else torch.addmm(b, xb, w.t())  # (n, V), logits
                logp = torch.log_softmax(z, dim=1, dtype=torch.float32)  # (n, V)
                loss = -on * logp.gather(1, tb[:, None]).squeeze(1)  # (n,)
                if spread:
                    loss = loss - spread * logp.sum(dim=1)
                total += loss.sum(dtype=torch.float64)
                if not (need_x or need_w or need_b):
                    continue
                g = logp.exp_()  # softmax (n, V), in place
                if spread:
                    g.sub_(spread)
                g.scatter_add_(1, tb[:, None], g.new_full((tb.size(0), 1), -on))  # softmax - q
                if grad_b is not None:
                    grad_b += g.sum(dim=0)
                gc = g.to(dtype)
                if grad_x is not None:
                    grad_x[start : start + rows] = gc @ w  # (n, D)
                if grad_w is not None:
                    grad_w += (gc.t() @ xb).float()  # (V, D)
            ctx.save_for_backward(grad_x, grad_w, grad_b)
            ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
            return total.to(torch.float32)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        grad_x, grad_w, grad_b = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        out = []
        for g, dtype in ((grad_x, x_dtype), (grad_w, w_dtype), (grad_b, b_dtype)):
            out.append(None if g is None else (g * grad).to(dtype))
        return (*out, None, None, None, None, None)


@compile_excluded
def projected_cross_entropy(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    label_smoothing: float = 0.0,
    rows: int | None = None,
) -> Tensor:
    """Summed cross-entropy of the projection ``x @ weight.T + bias`` against ``targets``.

    x (N, D), weight (V, D), bias (V,) or None, targets (N,) in [0, V). Equal to
    ``F.cross_entropy(F.linear(x, weight, bias).float(), targets, label_smoothing=...,
    reduction="sum")``, a scalar, with the same gradients. ``rows`` per block default to
    :func:`block_rows`. ``torch.compile`` leaves it out of its graphs and runs it as it is.
    The gradients are computed along with the loss only where autograd records (not under
    ``torch.no_grad`` or ``torch.inference_mode``, as in validation).
    """
    if x.dim() != 2 or targets.shape != x.shape[:1]:
        raise ValueError(f"x (N, D) and targets (N,) expected, got {tuple(x.shape)}, "
                         f"{tuple(targets.shape)}")  # fmt: skip
    rows = rows or block_rows(weight.size(0), x.device)
    return _ProjectedCrossEntropy.apply(
        x, weight, bias, targets, float(label_smoothing), rows, compute_dtype(x),
        torch.is_grad_enabled(),
    )  # fmt: skip

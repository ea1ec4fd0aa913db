"""R-Drop (Liang et al., 2021): two dropout passes over each batch, trained to agree.

Each target token is predicted twice, by two forward passes of the same batch under different
dropout masks, with distributions ``p1`` and ``p2`` over the vocabulary. The loss is that of
the paper, ``CE(p1) + CE(p2) + alpha * (KL(p1 || p2) + KL(p2 || p1)) / 2`` per token (CE the
label-smoothed cross-entropy), halved, so that its scale is the ordinary loss's: the mean of
the two passes' losses plus ``alpha / 4`` times the sum of the two KL divergences.

:func:`reference_rdrop_loss` is that definition in plain PyTorch (the tests' oracle).
:func:`projected_rdrop_loss` computes it as :func:`~nmt.models.loss.projected_cross_entropy`
computes the cross-entropy, from the features before the vocabulary projection, a block of
tokens at a time, with the gradients of the logits formed alongside the loss: with
``D = log p1 - log p2``, the symmetric divergence of a token is ``sum_v (p1 - p2) D`` and its
gradient with respect to the first pass's logits ``p1 * (D - E_p1[D]) + p1 - p2`` (the second
pass's by symmetry), beside each pass's ``p - q`` of the cross-entropy. No tokens-by-vocabulary
tensor is kept beyond a block.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.models.compile_exclusion import compile_excluded
from nmt.models.loss import block_rows, compute_dtype


def reference_rdrop_loss(
    x1: Tensor,
    x2: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    label_smoothing: float,
    alpha: float,
) -> Tensor:
    """The summed R-Drop loss of the two passes' features ``x1`` and ``x2`` (N, D) for the N
    ``targets``, projected by ``weight`` (V, D) and ``bias`` (V,) or None; see the module doc.
    Builds both passes' N x V logits, in fp32."""
    logits = [F.linear(x, weight, bias).float() for x in (x1, x2)]  # (N, V) each
    ce = sum(
        F.cross_entropy(z, targets, label_smoothing=label_smoothing, reduction="sum")
        for z in logits
    )
    logp1, logp2 = (F.log_softmax(z, dim=-1) for z in logits)
    # F.kl_div(log q, log p, log_target=True) is KL(p || q), summed over tokens and vocabulary
    kl_12 = F.kl_div(logp2, logp1, reduction="sum", log_target=True)
    kl_21 = F.kl_div(logp1, logp2, reduction="sum", log_target=True)
    return (ce + alpha * (kl_12 + kl_21) / 2) / 2


class _ProjectedRDrop(torch.autograd.Function):
    """The summed R-Drop loss of two passes' features; see the module doc."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x1: Tensor,
        x2: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        label_smoothing: float,
        alpha: float,
        rows: int,
        dtype: torch.dtype,
        grads: bool,
    ) -> Tensor:
        with torch.autocast(x1.device.type, enabled=False):  # dtypes chosen by the caller
            need = grads and any(ctx.needs_input_grad[:4])
            vocab = weight.size(0)
            on, spread = 1.0 - label_smoothing, label_smoothing / vocab  # q's weights
            w = weight.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            xs = (x1.to(dtype), x2.to(dtype))
            f32 = {"dtype": torch.float32, "device": x1.device}
            grad_x = [torch.empty(x1.shape, **f32), torch.empty(x2.shape, **f32)] if need else []
            grad_w = torch.zeros(weight.shape, **f32) if need else None
            grad_b = torch.zeros(vocab, **f32) if need and bias is not None else None
            total = torch.zeros((), dtype=torch.float64, device=x1.device)
            for start in range(0, x1.size(0), rows):
                tb = targets[start : start + rows, None]  # (n, 1)
                blocks = [x[start : start + rows] for x in xs]  # (n, D) each
                logps = [
                    torch.log_softmax(
                        xb @ w.t() if b is None else torch.addmm(b, xb, w.t()), dim=1,
                        dtype=torch.float32,
                    )
                    for xb in blocks
                ]  # fmt: skip
                diff = logps[0] - logps[1]  # (n, V): log p1 - log p2
                probs = [logp.exp() for logp in logps]  # (n, V) each
                loss = alpha / 4 * ((probs[0] - probs[1]) * diff).sum(dtype=torch.float64)
                for logp in logps:
                    loss -= (on * logp.gather(1, tb).sum(dtype=torch.float64)) / 2
                    if spread:
                        loss -= spread * logp.sum(dtype=torch.float64) / 2
                total += loss
                if not need:
                    continue
                for i, (p, other, xb) in enumerate(zip(probs, probs[::-1], blocks, strict=True)):
                    sign = 1.0 if i == 0 else -1.0  # D from this pass's side
                    centred = sign * diff
                    centred -= (p * centred).sum(dim=1, keepdim=True)  # D - E_p[D]
                    g = p.mul(centred).add_(p).sub_(other).mul_(alpha / 4)  # the KL's part
                    g.add_(p, alpha=0.5)  # the cross-entropy's (p - q) / 2
                    if spread:
                        g.sub_(spread / 2)
                    g.scatter_add_(1, tb, g.new_full(tb.shape, -on / 2))
                    if grad_b is not None:
                        grad_b += g.sum(dim=0)
                    gc = g.to(dtype)
                    grad_x[i][start : start + rows] = gc @ w  # (n, D)
                    grad_w += (gc.t() @ xb).float()  # type: ignore[operator]  # (V, D)
            ctx.save_for_backward(*grad_x, grad_w, grad_b)
            ctx.dtypes = (x1.dtype, x2.dtype, weight.dtype, None if bias is None else bias.dtype)
            return total.to(torch.float32)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        saved = ctx.saved_tensors
        if len(saved) < 4:  # no gradients were formed
            return (None,) * 10
        grads = (
            None if g is None else (g * grad).to(dt)
            for g, dt in zip(saved, ctx.dtypes, strict=True)
        )
        return (*grads, None, None, None, None, None, None)


@compile_excluded
def projected_rdrop_loss(
    x1: Tensor,
    x2: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    label_smoothing: float,
    alpha: float,
    rows: int | None = None,
) -> Tensor:
    """:func:`reference_rdrop_loss`, with the same gradients, a block of ``rows`` tokens at a
    time (by default half the rows :func:`~nmt.models.loss.block_rows` gives: a block holds
    both passes). Gradients are computed along with the loss only where autograd records."""
    if x1.dim() != 2 or x1.shape != x2.shape or targets.shape != x1.shape[:1]:
        raise ValueError(f"x1, x2 (N, D) and targets (N,) expected, got {tuple(x1.shape)}, "
                         f"{tuple(x2.shape)}, {tuple(targets.shape)}")  # fmt: skip
    rows = rows or max(1, block_rows(weight.size(0), x1.device) // 2)
    return _ProjectedRDrop.apply(
        x1, x2, weight, bias, targets, float(label_smoothing), float(alpha), rows,
        compute_dtype(x1), torch.is_grad_enabled(),
    )  # fmt: skip

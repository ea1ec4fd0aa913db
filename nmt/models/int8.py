"""Int8 inference layers for the CPU: :class:`Int8Linear` and :class:`Int8GRUCell`.

Weights are quantized once, symmetrically, with one scale per output row::

    s_w[n] = max_k |W[n, k]| / 127,    Wq[n, k] = round(W[n, k] / s_w[n])  in [-127, 127]

and activations on the fly, with one scale per input row (``m``)::

    s_x[m] = max_k |x[m, k]| / 127,    xq[m, k] = round(x[m, k] / s_x[m])

so ``x W^T`` is approximated by ``s_x[m] s_w[n] (xq Wq^T)[m, n]``, whose integer product
``torch._int_mm`` computes exactly in int32 (VNNI instructions where the CPU has them). Each
rounding moves an entry by at most half a step (s/2), which bounds the error of an output
(see :func:`int8_error_bound`). The float model stays the reference: :func:`quantize_int8`
returns a copy with int8 layers and leaves the model as it was.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

QMAX = 127  # symmetric int8: -128 is never used, so negation cannot overflow
TINY = 1e-20  # the least row maximum a scale is made from: x / scale stays finite
# rows of a block, times the larger of its input and output widths, at most this many: the
# temporaries of a block stay small and cached, where one (M, N) int32 result and (M, K)
# float quotient for the whole input cost more in fresh memory than the arithmetic
BLOCK_ELEMENTS = 1 << 20


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """x (M, K) float -> int8 (M, K) and the scales (M, 1): x ~ scale * q, row by row.

    A row of zeros keeps its zeros (its scale is tiny but not 0, so nothing divides by 0)."""
    amax = torch.maximum(x.amax(dim=1, keepdim=True), x.amin(dim=1, keepdim=True).neg_())
    scale = amax.clamp_min_(TINY).div_(QMAX)  # (M, 1)
    # |x / scale| <= 127 (up to float rounding, far from 127.5): no clamp before the cast
    return torch.div(x, scale).round_().to(torch.int8), scale


def int8_error_bound(x: Tensor, weight: Tensor) -> Tensor:
    """An upper bound of |int8 linear - float linear| for each output (M, N), bias aside.

    With x = s_x xq + e_x and W = s_w Wq + e_w, |e_x| <= s_x / 2 and |e_w| <= s_w / 2 entrywise,
    x W^T - s_x s_w xq Wq^T = e_x W^T + x e_w^T - e_x e_w^T, so the error of output (m, n) is
    at most s_x[m] / 2 * |W[n]|_1 + s_w[n] / 2 * |x[m]|_1 + K s_x[m] s_w[n] / 4."""
    s_x = x.abs().amax(dim=1, keepdim=True) / QMAX  # (M, 1)
    s_w = weight.abs().amax(dim=1) / QMAX  # (N,)
    k = x.size(1)
    return (
        s_x / 2 * weight.abs().sum(1)  # (M, N)
        + x.abs().sum(1, keepdim=True) * (s_w / 2)  # (M, N)
        + k * s_x * s_w / 4  # (M, N)
    )


class Int8Linear(nn.Module):
    """``nn.Linear`` for inference with int8 weights (per output row) and int8 activations
    (per input row, quantized at each call); float in and out, any leading dimensions."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        q, scale = quantize_rows(weight.detach().float())  # (N, K), (N, 1)
        self.register_buffer("weight_t", q.t().contiguous())  # (K, N), as _int_mm takes it
        self.register_buffer("weight_scale", scale.view(-1))  # (N,)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    @classmethod
    def from_float(cls, linear: nn.Linear) -> Int8Linear:
        return cls(linear.weight, linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float()  # (M, K)
        out = rows.new_empty(rows.size(0), self.out_features)  # (M, N)
        step = max(1, BLOCK_ELEMENTS // max(self.in_features, self.out_features))
        for start in range(0, rows.size(0), step):
            q, scale = quantize_rows(rows[start : start + step])  # (m, K) int8, (m, 1)
            acc = torch._int_mm(q, self.weight_t)  # (m, N) int32, exact
            block = out[start : start + step].copy_(acc).mul_(scale).mul_(self.weight_scale)
            if self.bias is not None:
                block.add_(self.bias)
        return out.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}"


class Int8GRUCell(nn.Module):
    """``nn.GRUCell`` for inference: the input and hidden projections are :class:`Int8Linear`,
    the gates are computed in float as in ``nn.GRUCell``::

        r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
        z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
        h' = (1 - z) * n + z * h
    """

    def __init__(self, cell: nn.GRUCell) -> None:
        super().__init__()
        self.hidden_size = cell.hidden_size
        self.ih = Int8Linear(cell.weight_ih, cell.bias_ih)  # (3H, I): r, z, n stacked
        self.hh = Int8Linear(cell.weight_hh, cell.bias_hh)  # (3H, H)

    def forward(self, x: Tensor, h: Tensor | None = None) -> Tensor:
        """x (B, I), h (B, H) (zeros if None) -> h' (B, H)."""
        if h is None:
            h = x.new_zeros(x.size(0), self.hidden_size)
        i_r, i_z, i_n = self.ih(x).chunk(3, dim=-1)  # (B, H) each
        h_r, h_z, h_n = self.hh(h).chunk(3, dim=-1)  # (B, H) each
        r = torch.sigmoid(i_r + h_r)
        z = torch.sigmoid(i_z + h_z)
        n = torch.tanh(torch.addcmul(i_n, r, h_n))  # tanh(i_n + r * h_n)
        return torch.lerp(n, h, z)  # n + z * (h - n) = (1 - z) * n + z * h


def quantize_int8(model: nn.Module, min_out_features: int = 2) -> nn.Module:
    """A copy of ``model`` in eval mode whose ``nn.Linear`` (with at least ``min_out_features``
    outputs: a projection to one score gains nothing) and ``nn.GRUCell`` layers are int8; the
    other layers (embeddings, ``nn.GRU``) stay float. ``model`` is left unchanged."""
    quantized = copy.deepcopy(model).eval()
    for parent in list(quantized.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.GRUCell):
                setattr(parent, name, Int8GRUCell(child))
            elif isinstance(child, nn.Linear) and child.out_features >= min_out_features:
                setattr(parent, name, Int8Linear.from_float(child))
    return quantized

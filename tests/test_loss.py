"""The blockwise projection + cross-entropy equals F.linear + F.cross_entropy, value and
gradients, in fp32 and under bf16 autocast, whatever the block size."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nmt.models.loss import (
    MAX_BLOCK_ELEMENTS,
    MIN_BLOCK_ROWS,
    block_rows,
    projected_cross_entropy,
)
from nmt.models.loss import reference_cross_entropy as reference

pytestmark = pytest.mark.usefixtures("one_thread")

N, D, V = 23, 16, 37


def inputs(bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=g).requires_grad_()
    w = (torch.randn(V, D, generator=g) * 0.3).requires_grad_()
    b = (torch.randn(V, generator=g) * 0.1).requires_grad_() if bias else None
    y = torch.randint(0, V, (N,), generator=g)
    return x, w, b, y


def grads(loss, tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None])


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 5, N, 100, None])
def test_equals_linear_then_cross_entropy_in_fp32(smoothing: float, bias: bool, rows) -> None:
    x, w, b, y = inputs(bias)
    want = reference(x, w, b, y, smoothing)
    got = projected_cross_entropy(x, w, b, y, smoothing, rows=rows)
    assert got.shape == () and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    for g_got, g_want in zip(grads(got, (x, w, b)), grads(want, (x, w, b)), strict=True):
        torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bias", [False, True])
def test_under_bf16_autocast_it_matches_the_autocast_reference(bias: bool) -> None:
    x, w, b, y = inputs(bias, seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = reference(x, w, b, y, 0.1)
        got = projected_cross_entropy(x, w, b, y, 0.1, rows=4)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    got_grads, want_grads = grads(got, (x, w, b)), grads(want, (x, w, b))
    for g_got, g_want in zip(got_grads, want_grads, strict=True):
        assert g_got.dtype == g_want.dtype == torch.float32  # the parameters' own dtype
        torch.testing.assert_close(g_got, g_want, rtol=0.02, atol=0.02)
    # and close to the exact fp32 gradients, as the reference is
    exact = grads(reference(x, w, b, y, 0.1), (x, w, b))
    for g_got, g_exact in zip(got_grads, exact, strict=True):
        assert (g_got - g_exact).abs().max() <= 0.05 * g_exact.abs().max()


def test_the_incoming_gradient_scales_every_gradient() -> None:
    """Backward multiplies the stored gradients by the incoming one (a loss scale, a mean)."""
    x, w, b, y = inputs(True)
    one = grads(projected_cross_entropy(x, w, b, y, 0.1, rows=4), (x, w, b))
    scaled = grads(projected_cross_entropy(x, w, b, y, 0.1, rows=4) * -2.5, (x, w, b))
    for a, s in zip(one, scaled, strict=True):
        torch.testing.assert_close(s, -2.5 * a)


def test_without_gradients_it_only_scores() -> None:
    x, w, b, y = inputs(True)
    want = reference(x, w, b, y, 0.0)
    with torch.inference_mode():
        got = projected_cross_entropy(x, w, b, y)
    torch.testing.assert_close(got, want.detach(), rtol=1e-6, atol=1e-5)
    frozen = projected_cross_entropy(x.detach(), w, None, y)  # only the weight needs a gradient
    (gw,) = torch.autograd.grad(frozen, [w])
    (want_gw,) = torch.autograd.grad(reference(x.detach(), w, None, y, 0.0), [w])
    torch.testing.assert_close(gw, want_gw, rtol=1e-5, atol=1e-6)


class MatrixProducts(TorchDispatchMode):
    """Counts the matrix products run while it is on (under inference_mode ``@`` reaches the
    mode as matmul, elsewhere as the mm or addmm it becomes)."""

    PRODUCTS = (
        torch.ops.aten.mm.default,
        torch.ops.aten.addmm.default,
        torch.ops.aten.matmul.default,
    )

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in self.PRODUCTS
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("off", [torch.no_grad, torch.inference_mode])
def test_without_gradients_no_gradient_is_computed(off) -> None:
    """Validation scores parameters that require gradients with autograd off: one product per
    block (the logits), none for the gradients of the features or the weight."""
    x, w, b, y = inputs(True)
    blocks = -(-N // 5)
    with off(), MatrixProducts() as products:
        projected_cross_entropy(x, w, b, y, rows=5)
    assert products.count == blocks
    with MatrixProducts() as products:
        projected_cross_entropy(x, w, b, y, rows=5)
    assert products.count == 3 * blocks  # with autograd on: logits, and both gradients


def test_a_block_has_rows_enough_for_fast_products_within_a_memory_ceiling() -> None:
    cpu = torch.device("cpu")
    assert block_rows(8000, cpu) == MIN_BLOCK_ROWS
    assert block_rows(58101, cpu) == MIN_BLOCK_ROWS  # OPUS-MT: not 36
    assert block_rows(256206, cpu) * 256206 <= MAX_BLOCK_ELEMENTS  # NLLB-200
    assert block_rows(100, cpu) == (1 << 21) // 100  # a small vocabulary: the cache budget
    assert block_rows(10**9, cpu) == 1  # never zero rows


def test_bad_shapes_are_refused() -> None:
    x, w, b, y = inputs(False)
    with pytest.raises(ValueError, match="targets"):
        projected_cross_entropy(x, w, b, y[:-1])
    with pytest.raises(ValueError, match="targets"):
        projected_cross_entropy(x[None], w, b, y)


def test_the_reference_is_cross_entropy_of_the_projection_by_hand() -> None:
    """The plain definition against the formula: -sum_v q_v log softmax(x W^T + b)_v."""
    x, w, b, y = inputs(bias=True)
    smoothing = 0.1
    with torch.no_grad():
        log_p = torch.log_softmax(x @ w.T + b, dim=-1)  # (N, V)
        q = torch.full_like(log_p, smoothing / log_p.size(1))
        q[torch.arange(len(y)), y] += 1 - smoothing
        want = -(q * log_p).sum()
        assert torch.allclose(reference(x, w, b, y, smoothing), want, rtol=1e-5)


def test_torch_compile_leaves_it_out_of_its_graphs() -> None:
    """Compiled, the code around the loss is traced and the loss runs as it is: no graph holds
    its operations (the log-softmax, the gather of the targets), and the value and gradients
    are eager mode's."""
    import torch._dynamo

    graphs: list[set[str]] = []

    def backend(gm: torch.fx.GraphModule, _: list[torch.Tensor]):
        graphs.append({str(node.target) for node in gm.graph.nodes if node.op == "call_function"})
        return gm.forward

    def loss(x, w, b, y):
        return projected_cross_entropy(torch.tanh(x), w, b, y, 0.1, rows=5) * 2

    x, w, b, y = inputs(bias=True)
    want = loss(x, w, b, y)
    torch._dynamo.reset()
    try:
        got = torch.compile(loss, backend=backend)(x, w, b, y)
    finally:
        torch._dynamo.reset()
    traced = set().union(*graphs)
    assert any("tanh" in op for op in traced) and any("mul" in op for op in traced), graphs
    left_out = ("softmax", "gather", "autograd")  # the loss's operations, or its whole function
    assert not any(word in op for op in traced for word in left_out), graphs
    torch.testing.assert_close(got, want)
    for g_got, g_want in zip(grads(got, (x, w, b)), grads(want, (x, w, b)), strict=True):
        torch.testing.assert_close(g_got, g_want)

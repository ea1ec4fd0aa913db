"""Attention pooling as the source articles teach it: Nadaraya-Watson kernel regression.

A query x is answered by pooling the values y_i of key-value pairs (x_i, y_i):
f(x) = sum_i alpha(x, x_i) y_i, with weights alpha >= 0 that sum to 1 over i.

* average pooling: alpha = 1 / n, the query is ignored;
* non-parametric attention (Nadaraya-Watson 1964, Gaussian kernel):
  alpha(x, x_i) = softmax_i(-(x - x_i)^2 / 2);
* parametric attention: alpha(x, x_i) = softmax_i(-((x - x_i) w)^2 / 2) with a scalar w learned
  by SGD. Each training input queries the *other* training pairs (its own pair is masked out);
  otherwise a huge w, which copies every y_i, would fit the training set perfectly.

Data: y = 2 sin(x) + x^0.8 + noise on x in [0, 5]. Writes ``pooling_fit.png`` (the fitted
curves and the training loss) and ``pooling_attention.png`` (the attention weights of every
test query over the training keys) into ``--out``::

    python scripts/attention_pooling.py --out outputs/demo    # or: make demo-pooling
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor


def target(x: Tensor) -> Tensor:
    """The noise-free function: 2 sin(x) + x^0.8, elementwise."""
    return 2 * torch.sin(x) + x**0.8


@dataclass
class Data:
    x_train: Tensor  # (n,) sorted keys
    y_train: Tensor  # (n,) noisy values
    x_test: Tensor  # (m,) evenly spaced queries
    y_test: Tensor  # (m,) noise-free target


def make_data(n_train: int = 50, noise: float = 0.5, seed: int = 0) -> Data:
    """n_train noisy samples of :func:`target` on [0, 5) and a test grid with step 0.1."""
    gen = torch.Generator().manual_seed(seed)
    x_train, _ = torch.sort(torch.rand(n_train, generator=gen) * 5)  # (n,)
    y_train = target(x_train) + noise * torch.randn(n_train, generator=gen)  # (n,)
    x_test = torch.arange(0, 5, 0.1)  # (m,)
    return Data(x_train, y_train, x_test, target(x_test))


def average_pooling(queries: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """Every query gets the mean value: predictions (Q,), weights (Q, K) all 1 / K."""
    weights = torch.full((queries.numel(), values.numel()), 1.0 / values.numel())  # (Q, K)
    return weights @ values, weights


def attention_pooling(
    queries: Tensor, keys: Tensor, values: Tensor, w: Tensor | float = 1.0, skip_self: bool = False
) -> tuple[Tensor, Tensor]:
    """Gaussian-kernel attention pooling: predictions (Q,) and weights (Q, K).

    queries (Q,), keys and values (K,); score(x, x_i) = -((x - x_i) w)^2 / 2.
    ``skip_self`` (queries == keys): a query may not attend to its own key (weight 0).
    """
    scores = -(((queries[:, None] - keys[None, :]) * w) ** 2) / 2  # (Q, K)
    if skip_self:
        scores = scores.masked_fill(torch.eye(len(queries), dtype=torch.bool), float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (Q, K), rows sum to 1
    return weights @ values, weights


def fit_w(
    data: Data, epochs: int = 20, lr: float = 5.0, init: float = 1.0
) -> tuple[float, list[float]]:
    """Learn w by full-batch SGD on the leave-one-out squared error; returns w and the losses."""
    w = torch.tensor(init, requires_grad=True)
    optimizer = torch.optim.SGD([w], lr=lr)
    losses = []
    for _ in range(epochs):
        optimizer.zero_grad()
        pred, _ = attention_pooling(data.x_train, data.x_train, data.y_train, w, skip_self=True)
        loss = ((pred - data.y_train) ** 2).mean() / 2  # scalar
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return float(w.detach()), losses


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def plot_fit(
    data: Data, predictions: dict[str, Tensor], losses: list[float], w: float, path: Path
) -> None:
    """Left: data, target and the three estimates; right: training loss of the parametric w."""
    fig = _new_figure(12, 4.8)
    ax, loss_ax = fig.subplots(1, 2, width_ratios=[2.2, 1])
    x_test, x_train = data.x_test.numpy(), data.x_train.numpy()
    ax.plot(x_test, data.y_test.numpy(), color="black", lw=2, label="truth: 2 sin(x) + x^0.8")
    ax.scatter(x_train, data.y_train.numpy(), s=18, color="grey", alpha=0.6, label="training pairs")
    for (name, pred), style in zip(predictions.items(), ("--", "-", "-"), strict=True):
        ax.plot(x_test, pred.numpy(), style, lw=2, label=name)
    ax.set(xlabel="x (query / key)", ylabel="y (value)", title="attention pooling estimates")
    ax.legend(loc="lower left", fontsize=9)
    loss_ax.plot(range(1, len(losses) + 1), losses, marker="o", ms=3)
    loss_ax.set(xlabel="SGD epoch", ylabel="leave-one-out MSE / 2", title=f"learning w = {w:.2f}")
    fig.savefig(path, dpi=110)


def plot_weights(data: Data, weights: dict[str, Tensor], path: Path) -> None:
    """One heatmap per method: test queries (rows) x training keys (columns), shared scale."""
    fig = _new_figure(4.6 * len(weights) + 1, 5)
    axes = fig.subplots(1, len(weights), sharey=True)
    vmax = max(float(w.max()) for w in weights.values())
    extent = (0, len(data.x_train), float(data.x_test[-1]) + 0.05, float(data.x_test[0]) - 0.05)
    image = None
    for ax, (name, w) in zip(axes, weights.items(), strict=True):
        image = ax.imshow(
            w.numpy(), cmap="viridis", vmin=0, vmax=vmax, aspect="auto", extent=extent
        )
        ax.set(title=name, xlabel="training key x_i (index, sorted by x)")
    axes[0].set_ylabel("test query x")
    bar = fig.colorbar(image, ax=list(axes), shrink=0.9)
    bar.set_label("attention weight alpha(x, x_i)")
    fig.suptitle("attention weights: each row sums to 1")
    fig.savefig(path, dpi=110)


def run(out: Path, n_train: int = 50, epochs: int = 20, lr: float = 5.0, seed: int = 0) -> dict:
    """Fit the three estimators, write both figures; returns test MSEs, w and the paths."""
    torch.manual_seed(seed)
    data = make_data(n_train, seed=seed)
    w, losses = fit_w(data, epochs, lr)
    methods = {
        "average pooling": average_pooling(data.x_test, data.y_train),
        "non-parametric (w = 1)": attention_pooling(data.x_test, data.x_train, data.y_train),
        f"parametric (learned w = {w:.2f})": attention_pooling(
            data.x_test, data.x_train, data.y_train, w
        ),
    }
    out.mkdir(parents=True, exist_ok=True)
    fit_png, weights_png = out / "pooling_fit.png", out / "pooling_attention.png"
    plot_fit(data, {k: pred for k, (pred, _) in methods.items()}, losses, w, fit_png)
    plot_weights(data, {k: weights for k, (_, weights) in methods.items()}, weights_png)
    mse = {k: float(((pred - data.y_test) ** 2).mean()) for k, (pred, _) in methods.items()}
    return {"mse": mse, "w": w, "losses": losses, "files": [fit_png, weights_png]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/demo"))
    parser.add_argument("--n-train", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = run(args.out, args.n_train, args.epochs, args.lr, args.seed)
    for name, mse in result["mse"].items():
        print(f"{name:<36} test MSE {mse:.3f}")
    print("wrote", *(str(p) for p in result["files"]))


if __name__ == "__main__":
    main()

"""Checkpoint averaging: ``nmt-average`` / ``make average RUN=... N=5``.

The model weights of the last N ``step_*.pt`` checkpoints of a run are averaged into a new
checkpoint (default ``<run>/checkpoints/averaged.pt``) that ``nmt-eval`` and ``nmt-translate``
load like any other (``CKPT=<run>/checkpoints/averaged.pt``). Floating-point tensors are
averaged (accumulated in float64, stored in their own dtype); integer and boolean tensors are
copied from the newest checkpoint. The result keeps the newest checkpoint's config, tokenizers
and training state (step), records which checkpoints it averages, and has no optimizer,
scheduler or random state: it is for decoding, not for resuming training.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from nmt.cli import exit_on_error, setup_logging
from nmt.store.checkpoint import save_checkpoint, step_checkpoints
from nmt.store.gate import CheckpointError
from nmt.store.loading import load_checked_checkpoint
from nmt.store.paths import resolve_run_dir

log = logging.getLogger(__name__)

KEPT_KEYS = ("config", "tokenizers", "state")  # what the averaged checkpoint keeps


def last_checkpoints(run_dir: Path, n: int) -> list[Path]:
    """The last ``n`` step checkpoints of a run; an error if the run kept fewer."""
    if n < 1:
        raise CheckpointError(f"N={n}: need at least one checkpoint to average")
    ckpt_dir = run_dir / "checkpoints"
    if not ckpt_dir.is_dir():
        raise CheckpointError(f"no checkpoint directory {ckpt_dir} (train a model first)")
    paths = step_checkpoints(ckpt_dir)
    if len(paths) < n:
        raise CheckpointError(
            f"{run_dir / 'checkpoints'} holds {len(paths)} step checkpoint(s), fewer than "
            f"N={n}: average fewer, or train with trainer.keep_last>={n}"
        )
    return paths[-n:]


def _check_compatible(first: dict[str, Tensor], other: dict[str, Tensor], path: Path) -> None:
    """Same parameter names, shapes and dtypes as the first checkpoint, or CheckpointError."""
    if first.keys() != other.keys():
        diff = sorted(set(first) ^ set(other))
        raise CheckpointError(f"{path} has different parameters: {', '.join(diff[:5])}")
    for name, t in first.items():
        if t.shape != other[name].shape or t.dtype != other[name].dtype:
            raise CheckpointError(
                f"{path}: {name} is {tuple(other[name].shape)} {other[name].dtype}, "
                f"expected {tuple(t.shape)} {t.dtype}"
            )


def average_state_dicts(paths: Sequence[Path]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Mean model weights of the checkpoints, loading one at a time; and the last payload."""
    sums: dict[str, Tensor] = {}
    reference: dict[str, Tensor] = {}
    payload: dict[str, Any] = {}
    for i, path in enumerate(paths):
        payload = load_checked_checkpoint(path)
        weights = payload["model"]
        if i == 0:
            reference = weights
            sums = {k: t.double() for k, t in weights.items() if t.is_floating_point()}
        else:
            _check_compatible(reference, weights, path)
            for name, total in sums.items():
                total += weights[name].double()
    model = {
        name: (sums[name] / len(paths)).to(t.dtype) if name in sums else t.clone()
        for name, t in payload["model"].items()
    }
    return model, payload


def average_checkpoints(paths: Sequence[Path]) -> dict[str, Any]:
    """A checkpoint payload whose model weights are the mean of the given checkpoints'.

    Floating-point tensors are averaged; others are taken from the last checkpoint, as are
    the config, tokenizers and training state. Optimizer, scheduler and random state are
    dropped. All checkpoints must have the same parameters (names, shapes, dtypes).
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise CheckpointError("no checkpoints to average")
    model, last = average_state_dicts(paths)
    payload = {key: last[key] for key in KEPT_KEYS}
    payload["model"] = model
    payload["averaged"] = {
        "checkpoints": [str(p) for p in paths],
        "count": len(paths),
    }
    return payload


def make_parser() -> argparse.ArgumentParser:
    """``nmt-average``'s command line."""
    parser = argparse.ArgumentParser(
        prog="nmt-average",
        description="Average the model weights of a run's last N step checkpoints.",
    )
    parser.add_argument("run", nargs="?", default="outputs/latest", help="run directory")
    parser.add_argument("-n", "--last", type=int, default=5, help="how many step checkpoints")
    parser.add_argument(
        "-o", "--out", type=Path, default=None, help="default: <run>/checkpoints/averaged.pt"
    )
    parser.add_argument(
        "--checkpoints",
        nargs="+",
        type=Path,
        default=None,
        help="average these files instead of the run's last N",
    )
    return parser


def run(argv: Sequence[str] | None = None) -> Path:
    """Average as the command line asks; returns the path of the averaged checkpoint."""
    args = make_parser().parse_args(argv)
    run_dir = resolve_run_dir(args.run)
    paths = args.checkpoints or last_checkpoints(run_dir, args.last)
    out = args.out or run_dir / "checkpoints" / "averaged.pt"
    save_checkpoint(average_checkpoints(paths), out)
    log.info("averaged %s into %s", ", ".join(p.name for p in paths), out)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """``nmt-average [RUN] [-n N] [-o OUT] [--checkpoints FILE...]``."""
    setup_logging()
    with exit_on_error(log):
        out = run(argv)
    print(out)


if __name__ == "__main__":
    main()

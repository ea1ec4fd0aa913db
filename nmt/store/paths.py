"""Run directories and the checkpoint files in them: ``outputs/latest``, which checkpoint a
command loads from a run (its ``decode.checkpoint``, else ``best.pt``, else ``last.pt``), and
the decoding defaults a run saved.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from nmt.atomic import atomic_write_bytes
from nmt.store.gate import CheckpointError, load_run_config

log = logging.getLogger(__name__)


def checkpoint_run_dir(ckpt: Path) -> Path | None:
    """The run directory holding ``ckpt`` (``<run>/checkpoints/x.pt``), or None for a file
    kept elsewhere. The one rule for it: decoding, export and a resumed training run use it."""
    ckpt = ckpt.resolve()
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None


def chosen_checkpoint(run_dir: Path, choice: str) -> str:
    """``decode.checkpoint`` resolved: ``auto`` is the averaged weights when their validation
    BLEU beat the best single checkpoint's (both in summary.json), else ``best``."""
    if choice != "auto":
        return choice
    summary_file = run_dir / "summary.json"
    if summary_file.is_file():
        summary = json.loads(summary_file.read_text())
        if summary.get("averaged_bleu", -1.0) > summary.get("best_bleu", -1.0):
            return "averaged"
    return "best"


def names_a_file(ckpt: str | Path | None) -> bool:
    """Whether ``ckpt=`` names a checkpoint file (an existing file, or a path with a folder)
    rather than a checkpoint of a run's ``checkpoints/`` (``best``, ``averaged``, ``step_400``)."""
    return bool(ckpt) and (Path(ckpt).is_file() or len(Path(ckpt).parts) > 1)


def checkpoint_path(run: str | Path, ckpt: str | Path | None = None) -> Path:
    """The checkpoint to load.

    ``ckpt`` is a file, or a name in the run's ``checkpoints/`` (``averaged``, ``last.pt``,
    ``step_400``). Without it: the run's ``decode.checkpoint`` (default ``best``; ``auto``
    picks by validation BLEU, see :func:`chosen_checkpoint`), falling
    back to the best, then the last checkpoint when that file was never written.
    """
    if names_a_file(ckpt):
        return Path(ckpt)
    run_dir = resolve_run_dir(run)
    if not run_dir.is_dir():
        raise CheckpointError(f"run directory not found: {run} (train a model first)")
    ckpt_dir = run_dir / "checkpoints"
    if ckpt:
        name = str(ckpt) if str(ckpt).endswith(".pt") else f"{ckpt}.pt"
        if (ckpt_dir / name).is_file():
            return ckpt_dir / name
        present = sorted(p.stem for p in ckpt_dir.glob("*.pt")) if ckpt_dir.is_dir() else []
        raise CheckpointError(
            f"no checkpoint {ckpt!r}: neither a file nor one of {ckpt_dir}: "
            f"{', '.join(present) or 'none'}"
        )
    preferred = f"{chosen_checkpoint(run_dir, run_decode_defaults(run_dir).checkpoint)}.pt"
    for name in dict.fromkeys((preferred, "best.pt", "last.pt")):
        path = ckpt_dir / name
        if path.is_file():
            return path
    raise CheckpointError(f"no checkpoint in {ckpt_dir}")


def update_latest_link(outputs: Path, run_dir: Path) -> None:
    """Point ``<outputs>/latest`` at ``run_dir`` (relative link, replaced atomically)."""
    outputs.mkdir(parents=True, exist_ok=True)
    link = outputs / "latest"
    tmp = outputs / f".latest.{os.getpid()}"
    try:
        target = os.path.relpath(run_dir.resolve(), outputs.resolve())
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(target)
        os.replace(tmp, link)
    except OSError as e:  # e.g. a filesystem without symlinks: record the path instead
        log.warning("could not update %s (%s); writing its path to %s.txt", link, e, link)
        atomic_write_bytes(outputs / "latest.txt", (str(run_dir.resolve()) + "\n").encode())


def resolve_run_dir(path: str | Path) -> Path:
    """A run directory given directly, through ``latest``, or through ``latest.txt``."""
    p = Path(path)
    if not p.exists() and p.name == "latest" and (p.parent / "latest.txt").is_file():
        p = Path((p.parent / "latest.txt").read_text().strip())
    return p.resolve()


def saved_decode(run_dir: Path) -> DictConfig | None:
    """The ``decode`` section of a run's config.yaml, None where there is none."""
    cfg = load_run_config(run_dir)
    return None if cfg is None else cfg.decode


def run_decode_defaults(run_dir: Path) -> DictConfig:
    """The ``decode`` section of a run's config.yaml (defaults for runs that predate it)."""
    defaults = OmegaConf.create({"beam": 1, "length_penalty": 1.0, "checkpoint": "best"})
    saved = saved_decode(run_dir)
    return defaults if saved is None else OmegaConf.merge(defaults, saved)

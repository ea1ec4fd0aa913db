"""A trained model: finding its checkpoint, and rebuilding the model, its tokenizers and its data
config from the checkpoint alone.

Everything read from a file goes through one gate (:mod:`nmt.gate`, re-exported here):
:func:`checked_train_config` merges a checkpoint's embedded config, or a run's ``config.yaml``,
into the typed schema before anything uses it. An unknown key, a value of the wrong type, an
impossible value or a model ``arch`` that is not in :mod:`nmt.models.registry` is a
:class:`CheckpointError` naming the file and the key; no value in a file is ever imported,
instantiated or evaluated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from nmt.checkpoint import CheckpointError, load_checkpoint
from nmt.data.tokenizer import PAD_ID, TokenizerPair
from nmt.gate import checked_train_config, load_run_config
from nmt.models import registry
from nmt.models.base import Seq2Seq
from nmt.runtime import resolve_run_dir


def build_model(cfg: DictConfig, tokenizers: TokenizerPair) -> Seq2Seq:
    """The registered model ``cfg.model.arch`` with the vocabulary sizes of the tokenizers."""
    return registry.build_model(
        cfg.model,
        src_vocab_size=tokenizers.src.vocab_size,
        tgt_vocab_size=tokenizers.tgt.vocab_size,
        pad_id=PAD_ID,
        shared_vocab=tokenizers.joint,
    )


def load_checked_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict:
    """A checkpoint's payload (verified, ``weights_only``) with its config checked; the
    payload's ``config`` stays plain data, ``checked_config`` holds the typed one."""
    payload = load_checkpoint(path, map_location)
    for key in ("config", "model", "tokenizers", "state"):
        if key not in payload:
            raise CheckpointError(f"checkpoint {path} has no {key!r} entry")
    payload["checked_config"] = checked_train_config(payload["config"], path)
    return payload


@dataclass
class Trained:
    model: Seq2Seq
    tokenizers: TokenizerPair
    cfg: DictConfig  # the training run's resolved config
    path: Path  # the checkpoint file
    step: int


def checkpoint_run_dir(ckpt: Path) -> Path | None:
    """The run directory holding ``ckpt`` (``<run>/checkpoints/x.pt``), or None for a file
    kept elsewhere. The one rule for it: decoding, export and a resumed training run use it."""
    ckpt = ckpt.resolve()
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None


def _saved_decode(run_dir: Path) -> DictConfig | None:
    """The ``decode`` section of a run's config.yaml, None where there is none."""
    cfg = load_run_config(run_dir)
    return None if cfg is None else cfg.decode


def run_decode_defaults(run_dir: Path) -> DictConfig:
    """The ``decode`` section of a run's config.yaml (defaults for runs that predate it)."""
    defaults = OmegaConf.create({"beam": 1, "length_penalty": 1.0, "checkpoint": "best"})
    saved = _saved_decode(run_dir)
    return defaults if saved is None else OmegaConf.merge(defaults, saved)


def decode_defaults(trained: Trained) -> DictConfig | None:
    """How a checkpoint is meant to be decoded: the ``decode`` section of its run's
    config.yaml (which ``nmt-tune-decode --apply`` updates) over the one saved in the
    checkpoint; only the latter for a checkpoint outside a run directory."""
    saved = trained.cfg.get("decode")
    run_dir = checkpoint_run_dir(trained.path)
    run = _saved_decode(run_dir) if run_dir is not None else None
    if run is None:
        return saved
    return run if saved is None else OmegaConf.merge(saved, run)


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


def checkpoint_path(run: str | Path, ckpt: str | Path | None = None) -> Path:
    """The checkpoint to load.

    ``ckpt`` is a file, or a name in the run's ``checkpoints/`` (``averaged``, ``last.pt``,
    ``step_400``). Without it: the run's ``decode.checkpoint`` (default ``best``; ``auto``
    picks by validation BLEU, see :func:`chosen_checkpoint`), falling
    back to the best, then the last checkpoint when that file was never written.
    """
    if ckpt and (Path(ckpt).is_file() or len(Path(ckpt).parts) > 1):
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


def load_trained(path: Path, device: torch.device) -> Trained:
    """The model, tokenizers and checked config of a checkpoint, ready to decode on ``device``."""
    payload = load_checked_checkpoint(path)
    cfg = payload["checked_config"]
    tokenizers = TokenizerPair.from_state_dict(payload["tokenizers"])
    model = build_model(cfg, tokenizers)
    model.load_state_dict(payload["model"])
    model.to(device).eval()
    return Trained(model, tokenizers, cfg, path, int(payload["state"]["step"]))

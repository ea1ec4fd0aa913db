"""Rebuilding a trained model, its tokenizers and its data config from a checkpoint alone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from nmt.checkpoint import CheckpointError, load_checkpoint
from nmt.data.tokenizer import PAD_ID, TokenizerPair
from nmt.models.base import Seq2Seq
from nmt.runtime import resolve_run_dir


def build_model(cfg: DictConfig, tokenizers: TokenizerPair) -> Seq2Seq:
    """Instantiate ``cfg.model`` with the vocabulary sizes of the tokenizers."""
    return instantiate(
        cfg.model,
        src_vocab_size=tokenizers.src.vocab_size,
        tgt_vocab_size=tokenizers.tgt.vocab_size,
        pad_id=PAD_ID,
        shared_vocab=tokenizers.joint,
    )


@dataclass
class Trained:
    model: Seq2Seq
    tokenizers: TokenizerPair
    cfg: DictConfig  # the training run's resolved config
    path: Path  # the checkpoint file
    step: int


def checkpoint_path(run: str | Path, ckpt: str | Path | None = None) -> Path:
    """``ckpt`` if given, else the run's best checkpoint (its last one if it has no best)."""
    if ckpt:
        return Path(ckpt)
    run_dir = resolve_run_dir(run)
    if not run_dir.is_dir():
        raise CheckpointError(f"run directory not found: {run} (train a model first)")
    for name in ("best.pt", "last.pt"):
        path = run_dir / "checkpoints" / name
        if path.is_file():
            return path
    raise CheckpointError(f"no checkpoint in {run_dir / 'checkpoints'}")


def load_trained(path: Path, device: torch.device) -> Trained:
    payload = load_checkpoint(path)
    cfg = OmegaConf.create(payload["config"])
    tokenizers = TokenizerPair.from_state_dict(payload["tokenizers"])
    model = build_model(cfg, tokenizers)
    model.load_state_dict(payload["model"])
    model.to(device).eval()
    return Trained(model, tokenizers, cfg, path, int(payload["state"]["step"]))

"""Rebuilding a trained model, its tokenizers and its data config from a checkpoint alone.

Everything read from a file goes through one gate: :func:`checked_train_config` merges a
checkpoint's embedded config, or a run's ``config.yaml``, into the typed schema before anything
uses it. An unknown key, a value of the wrong type, an impossible value or a model ``arch`` that
is not in :mod:`nmt.models.registry` is a :class:`CheckpointError` naming the file and the key;
no value in a file is ever imported, instantiated or evaluated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.checkpoint import CheckpointError, load_checkpoint
from nmt.config import MODEL_SCHEMAS, ConfigError, TrainConfig, validate
from nmt.data.tokenizer import PAD_ID, TokenizerPair
from nmt.models import registry
from nmt.models.base import Seq2Seq
from nmt.runtime import resolve_run_dir

# Model configs of checkpoints written before models were named by ``arch``: the class path
# they carried, accepted only as a name of a registered model (it is never imported).
LEGACY_TARGETS = {
    "nmt.models.transformer.Transformer": "transformer",
    "nmt.models.gru.GRUBahdanau": "gru_bahdanau",
}


def build_model(cfg: DictConfig, tokenizers: TokenizerPair) -> Seq2Seq:
    """The registered model ``cfg.model.arch`` with the vocabulary sizes of the tokenizers."""
    return registry.build_model(
        cfg.model,
        src_vocab_size=tokenizers.src.vocab_size,
        tgt_vocab_size=tokenizers.tgt.vocab_size,
        pad_id=PAD_ID,
        shared_vocab=tokenizers.joint,
    )


def _model_arch(model: Any, source: str) -> str:
    """The registered architecture a stored model config names (``arch``, or a legacy
    ``_target_`` that is exactly one of the registered classes' paths)."""
    if not isinstance(model, Mapping):
        raise CheckpointError(f"{source}: config key 'model' must be a mapping, not {model!r}")
    if "_target_" in model:
        target = model["_target_"]
        if "arch" in model or target not in LEGACY_TARGETS:
            raise CheckpointError(
                f"{source}: config key 'model._target_'={target!r} is refused: a stored model "
                f"config names its model by model.arch, one of: {', '.join(MODEL_SCHEMAS)}"
            )
        return LEGACY_TARGETS[target]
    arch = model.get("arch")
    if arch not in MODEL_SCHEMAS:
        raise CheckpointError(
            f"{source}: config key 'model.arch'={arch!r} is not one of: {', '.join(MODEL_SCHEMAS)}"
        )
    return arch


def _refuse_interpolations(node: Any, source: str, key: str) -> None:
    """Stored configs are written resolved: a ``${...}`` in one is refused, not resolved."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            _refuse_interpolations(v, source, f"{key}.{k}" if key else str(k))
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            _refuse_interpolations(v, source, f"{key}[{i}]")
    elif isinstance(node, str) and "${" in node:
        raise CheckpointError(
            f"{source}: config key {key!r}={node!r} is refused: stored configs hold plain "
            "values, not interpolations"
        )


def checked_train_config(raw: Any, source: str | Path) -> DictConfig:
    """A training config read from a file, merged into the typed schema and validated.

    ``raw`` is plain data (a checkpoint's ``config``, or a parsed config.yaml). The result is a
    typed config (struct mode: no key can be added later). Anything the schema does not allow
    raises :class:`CheckpointError` naming ``source`` and the key, before anything is built.
    """
    source = str(source)
    if not isinstance(raw, Mapping):
        raise CheckpointError(f"{source}: the config is not a mapping")
    _refuse_interpolations(raw, source, "")
    raw = dict(raw)
    arch = _model_arch(raw.get("model"), source)
    raw["model"] = {k: v for k, v in raw["model"].items() if k != "_target_"} | {"arch": arch}
    schema = OmegaConf.structured(TrainConfig)
    schema.model = OmegaConf.structured(MODEL_SCHEMAS[arch])
    try:
        cfg = OmegaConf.merge(schema, raw)
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # no missing value
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{source}: config key {key!r} is invalid: {reason}") from None
    try:
        validate(cfg)
    except ConfigError as e:
        raise CheckpointError(f"{source}: {e}") from None
    OmegaConf.set_struct(cfg, True)
    return cfg


def load_run_config(run_dir: Path) -> DictConfig | None:
    """A run's config.yaml, checked like a checkpoint's config; None where there is none."""
    config_file = Path(run_dir) / "config.yaml"
    if not config_file.is_file():
        return None
    try:
        raw = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise CheckpointError(f"{config_file}: not a readable YAML file: {e}") from None
    return checked_train_config(raw, config_file)


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
    kept elsewhere."""
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

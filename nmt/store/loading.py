"""A trained model rebuilt from what is stored: a checkpoint or a model package, through one
gate.

Everything read from a file goes through :mod:`nmt.store.gate`: :func:`~nmt.store.gate.
checked_train_config` merges a checkpoint's embedded config, a run's ``config.yaml`` or a
package's into the typed schema before anything uses it. An unknown key, a value of the wrong
type, an impossible value or a model ``arch`` that is not in :mod:`nmt.models.registry` is a
:class:`~nmt.store.gate.CheckpointError` naming the file and the key; no value in a file is
ever imported, instantiated or evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from nmt.config import ConfigError
from nmt.data.multilingual import directions_of
from nmt.data.tokenizer import PAD_ID, TokenizerPair
from nmt.models import registry
from nmt.models.base import Seq2Seq
from nmt.models.ensemble import Ensemble
from nmt.store.checkpoint import load_checkpoint
from nmt.store.gate import CheckpointError, checked_train_config
from nmt.store.package import (
    WEIGHTS,
    is_package,
    read_package,
    verified_file,
)
from nmt.store.paths import checkpoint_path, checkpoint_run_dir, names_a_file, saved_decode


def build_model(cfg: DictConfig, tokenizers: TokenizerPair) -> Seq2Seq:
    """The registered model ``cfg.model.arch`` with the vocabulary sizes of the tokenizers."""
    fields = OmegaConf.to_container(cfg.model, resolve=True)
    assert isinstance(fields, dict)
    try:
        return registry.create_model(
            fields,
            src_vocab_size=tokenizers.src.vocab_size,
            tgt_vocab_size=tokenizers.tgt.vocab_size,
            pad_id=PAD_ID,
            shared_vocab=tokenizers.joint,
        )
    except registry.UnknownModelError as e:
        raise ConfigError(str(e)) from None


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
    # an ensemble (``model`` is an :class:`~nmt.models.ensemble.Ensemble`): every member's
    # checkpoint or package, ``path`` first; empty for a single model
    members: tuple[Path, ...] = ()


def decode_defaults(trained: Trained) -> DictConfig | None:
    """How a checkpoint is meant to be decoded: the ``decode`` section of its run's
    config.yaml (which ``nmt-tune-decode --apply`` updates) over the one saved in the
    checkpoint; only the latter for a checkpoint outside a run directory."""
    saved = trained.cfg.get("decode")
    run_dir = checkpoint_run_dir(trained.path)
    run = saved_decode(run_dir) if run_dir is not None else None
    if run is None:
        return saved
    return run if saved is None else OmegaConf.merge(saved, run)


def load_trained(path: Path, device: torch.device) -> Trained:
    """The model, tokenizers and checked config of a checkpoint, ready to decode on ``device``."""
    payload = load_checked_checkpoint(path)
    cfg = payload["checked_config"]
    tokenizers = TokenizerPair.from_state_dict(payload["tokenizers"])
    model = build_model(cfg, tokenizers)
    model.load_state_dict(payload["model"])
    model.to(device).eval()
    return Trained(model, tokenizers, cfg, path, int(payload["state"]["step"]))


def unique_weights(model: Seq2Seq) -> dict[str, torch.Tensor]:
    """The model's state dict with each shared (tied) tensor once, under its first name."""
    seen: set[int] = set()
    out = {}
    for name, tensor in model.state_dict().items():
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        out[name] = tensor.detach().contiguous().cpu()
    return out


def load_weights(model: Seq2Seq, path: Path) -> None:
    """Load a package's safetensors file into ``model``: exactly the tensors it expects."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        weights = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file: {e}") from None
    expected = set(unique_weights(model))
    for name in sorted(set(weights) - expected):
        raise CheckpointError(f"{path}: unexpected tensor {name!r} for this model")
    for name in sorted(expected - set(weights)):
        raise CheckpointError(f"{path}: tensor {name!r} is missing")
    try:
        model.load_state_dict(weights, strict=False)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: {str(e).splitlines()[0]}") from None


def load_package(package: str | Path, device: torch.device) -> Trained:
    """The model, tokenizers and checked config of a package, ready to decode on ``device``.

    ``Trained.path`` is the package folder; its decoding defaults are the ``decode`` section of
    its config.yaml.
    """
    package = Path(package)
    manifest, cfg, tokenizers = read_package(package)
    if not manifest.torch_weights:
        raise CheckpointError(
            f"{package} holds only a CTranslate2 model (exported with --ctranslate2-only): "
            "decode it with engine=ctranslate2; engine=torch and nmt-attention need a package "
            "with the PyTorch weights"
        )
    model = build_model(cfg, tokenizers)
    load_weights(model, verified_file(package, manifest, WEIGHTS))
    model.to(device).eval()
    return Trained(model, tokenizers, cfg, package, int(manifest.step))


def load_model(cfg: DictConfig, device: torch.device) -> Trained:
    """The model a command's :class:`~nmt.config.ModelSource` fields name: ``model_dir`` (a
    package), or ``run``/``ckpt`` (a checkpoint; a package folder given as ``run`` is read as a
    package); with ``ensemble`` (:class:`~nmt.config.EnsembleSource`), its members too."""
    trained = _load_one(cfg, device)
    if cfg.get("ensemble"):
        return load_ensemble(trained, list(cfg.ensemble), cfg.get("ckpt"), device)
    return trained


def _load_one(cfg: DictConfig, device: torch.device) -> Trained:
    package = None
    if cfg.get("model_dir"):
        if cfg.get("ckpt"):
            raise ConfigError(f"give model={cfg.model_dir} or ckpt={cfg.ckpt}, not both")
        package = Path(cfg.model_dir)
    elif not cfg.get("ckpt") and is_package(cfg.run):
        package = Path(cfg.run)
    if package is None:
        return load_trained(checkpoint_path(cfg.run, cfg.ckpt), device)
    files = read_package(package)
    if not files.manifest.torch_weights and cfg.get("engine") in ("ctranslate2", "auto"):
        # a CTranslate2-only package: no PyTorch model, the engine decodes it (model is None)
        return Trained(None, files.tokenizers, files.cfg, package, int(files.manifest.step))  # type: ignore[arg-type]
    return load_package(package, device)


def _direction(trained: Trained) -> str:
    """What a model translates: its language pair, or a multilingual model's directions."""
    data = trained.cfg.data
    directions = directions_of(data)
    if directions:
        return ", ".join(f"{d.src}-{d.tgt}" for d in directions)
    return f"{data.get('src_lang')}-{data.get('tgt_lang')}"


def load_ensemble(
    first: Trained, others: list[str], ckpt: str | None, device: torch.device
) -> Trained:
    """``first`` and the models ``others`` names (run directories, whose checkpoint is chosen
    as ``ckpt`` chooses the first's, checkpoint files or packages) as one
    :class:`~nmt.models.ensemble.Ensemble`; the other fields are the first's. The members
    must share their tokenizers and their direction."""
    if first.model is None:
        raise ConfigError(
            f"ensemble: {first.path} holds only a CTranslate2 model; an ensemble decodes "
            "with PyTorch weights"
        )
    one_file = names_a_file(ckpt)
    members = [first]
    for spec in others:
        if is_package(spec):
            members.append(load_package(Path(spec), device))
        elif Path(spec).is_file():
            members.append(load_trained(Path(spec), device))
        elif one_file:
            raise ConfigError(
                f"ensemble: ckpt={ckpt} is one file and cannot choose the checkpoint of {spec}; "
                "give that member as a checkpoint file, or ckpt as a name (best, averaged, ...)"
            )
        else:
            members.append(load_trained(checkpoint_path(spec, ckpt), device))
    for other in members[1:]:
        if other.tokenizers.state_dict() != first.tokenizers.state_dict():
            raise ConfigError(
                f"ensemble: {other.path} has other tokenizers than {first.path}; the members "
                "of an ensemble must share their vocabulary (train them with one data config)"
            )
        if _direction(other) != _direction(first):
            raise ConfigError(
                f"ensemble: {other.path} translates {_direction(other)}, "
                f"{first.path} {_direction(first)}"
            )
    model = Ensemble([m.model for m in members]).eval()  # the members are on ``device``
    return replace(first, model=model, members=tuple(m.path for m in members))

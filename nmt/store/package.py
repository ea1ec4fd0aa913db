"""Model packages: a trained model as a self-contained folder, ``nmt-export`` / ``make export``.

A package holds everything decoding needs and nothing else, under fixed names::

    package.json        manifest: format, training step, source checkpoint, sha256 of every file
    config.yaml         the run's resolved config (model, data, decode defaults), typed like a
                        run's config.yaml
    model.safetensors   the weights (no pickle); a tied matrix is stored once
    tokenizer/          spm.model (one joint vocabulary) or src.model + tgt.model
    README.md           the model card: model, parameters, data and its licence, training
                        command, scores with their sacreBLEU signatures
    ctranslate2/        with --format ctranslate2: the CTranslate2 model (model.bin, config.json,
                        vocabulary), optionally quantized

Loading goes through the gate every checkpoint goes through: ``config.yaml`` is read by
:func:`nmt.store.gate.load_run_config` (typed schema, registered models only) and the manifest is
merged into its own typed schema, so an unknown key, a wrong type or an unregistered model is a
:class:`CheckpointError` naming the file and the key. File names are fixed, never read from the
package; every file is checked against the sha256 in the manifest before it is used.

This module reads packages without PyTorch (manifest, config, tokenizers: what a CTranslate2
server needs); :mod:`nmt.ship.export` writes them and builds their PyTorch model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.atomic import sha256_file
from nmt.data.corpus import DataError
from nmt.data.tokenizer import Tokenizer, TokenizerPair
from nmt.store.gate import CheckpointError, load_run_config

FORMAT = "nmt-package/1"
MANIFEST = "package.json"
CONFIG = "config.yaml"
WEIGHTS = "model.safetensors"
CARD = "README.md"
JOINT_TOKENIZER = "tokenizer/spm.model"
SRC_TOKENIZER = "tokenizer/src.model"
TGT_TOKENIZER = "tokenizer/tgt.model"
CT2_DIR = "ctranslate2"
CT2_FILES = (
    "ctranslate2/model.bin",
    "ctranslate2/config.json",
    "ctranslate2/shared_vocabulary.json",
    "ctranslate2/source_vocabulary.json",
    "ctranslate2/target_vocabulary.json",
)
FORMATS = ("torch", "ctranslate2", "hf")  # hf: a transformers model folder (nmt.ship.hf)
QUANTIZATIONS = ("float32", "int8", "int16", "float16")
MULTI30K_LICENCE = (
    "Multi30k (Elliott et al., 2016: Multi30K: Multilingual English-German Image Descriptions) "
    "extends the Flickr30k image descriptions. This package does not relicense them: their use "
    "is governed by the terms of the Multi30k distribution (https://github.com/multi30k/dataset) "
    "and of Flickr30k; check both before any use beyond research."
)


@dataclass
class CTranslate2Manifest:
    """The CTranslate2 model of a package: its weight type and the version that wrote it."""

    quantization: str = "float32"
    version: str = MISSING


@dataclass
class Manifest:
    """``package.json``: what the package is and the sha256 of each of its files."""

    format: str = MISSING
    arch: str = MISSING
    step: int = MISSING
    joint_vocab: bool = MISSING
    parameters: int = MISSING
    source_checkpoint: str = ""
    source_sha256: str = ""
    files: dict[str, str] = field(default_factory=dict)  # relative path -> sha256
    ctranslate2: CTranslate2Manifest | None = None
    torch_weights: bool = True  # False: --ctranslate2-only, no model.safetensors
    directions: list[str] = field(default_factory=list)  # a multilingual model's (de-en, ...)
    tag_placement: str = ""  # its data.tag_placement: source | target (empty: bilingual)


def is_package(path: str | Path | None) -> bool:
    """Whether ``path`` is a folder holding a package manifest."""
    return path is not None and (Path(path) / MANIFEST).is_file()


# ---------------------------------------------------------------------------------- reading


def read_manifest(package: Path) -> DictConfig:
    """``package.json`` merged into :class:`Manifest` (typed; unknown keys refused)."""
    path = package / MANIFEST
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a readable JSON file: {e}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: the manifest is not a JSON object")
    try:
        manifest = OmegaConf.merge(OmegaConf.structured(Manifest), raw)
        OmegaConf.to_container(manifest, throw_on_missing=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{path}: key {key!r} is invalid: {reason}") from None
    if manifest.format != FORMAT:
        raise CheckpointError(f"{path}: key 'format'={manifest.format!r} is not {FORMAT!r}")
    allowed = {CONFIG, WEIGHTS, CARD, JOINT_TOKENIZER, SRC_TOKENIZER, TGT_TOKENIZER, *CT2_FILES}
    for name in manifest.files:
        if name not in allowed:
            raise CheckpointError(f"{path}: key 'files.{name}' names no file a package holds")
    if manifest.ctranslate2 is not None and manifest.ctranslate2.quantization not in QUANTIZATIONS:
        raise CheckpointError(
            f"{path}: key 'ctranslate2.quantization'={manifest.ctranslate2.quantization!r} is "
            f"not one of: {', '.join(QUANTIZATIONS)}"
        )
    return manifest


def verified_file(package: Path, manifest: DictConfig, name: str) -> Path:
    """``package/name`` after checking it against the manifest's sha256."""
    path = package / name
    expected = manifest.files.get(name)
    if expected is None:
        raise CheckpointError(f"{package / MANIFEST}: no sha256 for {name} in key 'files'")
    if not path.is_file():
        raise CheckpointError(f"{path}: missing from the package")
    if sha256_file(path) != expected:
        raise CheckpointError(f"{path}: its sha256 does not match the manifest (corrupted?)")
    return path


def tokenizer_files(joint: bool) -> list[str]:
    return [JOINT_TOKENIZER] if joint else [SRC_TOKENIZER, TGT_TOKENIZER]


def load_package_tokenizers(package: Path, manifest: DictConfig) -> TokenizerPair:
    try:
        if manifest.joint_vocab:
            tok = Tokenizer.load(verified_file(package, manifest, JOINT_TOKENIZER))
            return TokenizerPair(tok, tok, joint=True)
        src = Tokenizer.load(verified_file(package, manifest, SRC_TOKENIZER))
        tgt = Tokenizer.load(verified_file(package, manifest, TGT_TOKENIZER))
    except DataError as e:
        raise CheckpointError(str(e)) from None
    return TokenizerPair(src, tgt, joint=False)


class PackageFiles(NamedTuple):
    """What a package holds besides its weights, each read through its gate."""

    manifest: DictConfig
    cfg: DictConfig  # the typed training config (model, data, decode defaults)
    tokenizers: TokenizerPair


def read_package(package: str | Path) -> PackageFiles:
    """A package's manifest, checked config and tokenizers (its weights are not read)."""
    package = Path(package)
    if not is_package(package):
        raise CheckpointError(f"{package}: not a model package (no {MANIFEST})")
    manifest = read_manifest(package)
    verified_file(package, manifest, CONFIG)
    cfg = load_run_config(package)  # the gate of every checkpoint and run config
    assert cfg is not None
    if cfg.model.arch != manifest.arch:
        raise CheckpointError(
            f"{package / MANIFEST}: key 'arch'={manifest.arch!r} differs from model.arch="
            f"{cfg.model.arch!r} of {package / CONFIG}"
        )
    check_languages(package, manifest, cfg)
    return PackageFiles(manifest, cfg, load_package_tokenizers(package, manifest))


def check_languages(package: Path, manifest: DictConfig, cfg: DictConfig) -> None:
    """The manifest's directions and tag placement must be config.yaml's (a package from
    before them names none)."""
    from nmt.data.multilingual import directions_of, placement_of

    if not manifest.directions and not manifest.tag_placement:
        return
    directions = [str(d) for d in directions_of(cfg.data)]
    placement = placement_of(cfg.data) if directions else ""
    for key, listed, own in (
        ("directions", list(manifest.directions), directions),
        ("tag_placement", manifest.tag_placement, placement),
    ):
        if listed != own:
            raise CheckpointError(
                f"{package / MANIFEST}: key {key!r}={listed!r} differs from {own!r} in "
                f"{package / CONFIG} (data.{key})"
            )


def model_argument(args: list[str]) -> list[str]:
    """``model=DIR`` on the command line -> ``model_dir=DIR``: Hydra reserves ``model=`` for
    the model config group, so the package folder travels under another key."""
    return [
        "model_dir=" + a.split("=", 1)[1] if a.startswith(("model=", "+model=")) else a
        for a in args
    ]

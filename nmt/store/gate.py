"""The gate every stored config passes before anything uses it (no PyTorch needed).

:func:`checked_train_config` merges a checkpoint's embedded config, a run's ``config.yaml`` or a
model package's ``config.yaml`` into the typed schema. An unknown key, a value of the wrong type, an
impossible value, a ``${...}`` interpolation or a model ``arch`` that is not one of the registered
models is a :class:`CheckpointError` naming the file and the key; no value in a file is ever
imported, instantiated or evaluated. Keys that have moved since a file was written
(:data:`MOVED_KEYS`) are read at their new place. This module imports neither PyTorch nor the
models, so a CTranslate2 server can use the same gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.cli import UserError
from nmt.config import MODEL_SCHEMAS, ConfigError, TrainConfig
from nmt.config_checks import check_train_config


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that is missing, truncated, corrupted or not loadable safely."""


# Model configs of checkpoints written before models were named by ``arch``: the class path
# they carried, accepted only as a name of a registered model (it is never imported).
LEGACY_TARGETS = {
    "nmt.models.transformer.Transformer": "transformer",
    "nmt.models.gru.GRUBahdanau": "gru_bahdanau",
}


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


# Keys that moved: a config written before the move holds the old key, read as the new one.
MOVED_KEYS = {
    ("trainer", "max_output_len_a"): ("decode", "max_output_len_a"),
    ("trainer", "max_output_len_b"): ("decode", "max_output_len_b"),
}


def _moved_keys(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """``raw`` with every key of :data:`MOVED_KEYS` at its new place (sections copied, never
    changed in place); a file holding both, with different values, is refused."""
    for (old_section, key), (new_section, new_key) in MOVED_KEYS.items():
        old = raw.get(old_section)
        if not isinstance(old, Mapping) or key not in old:
            continue
        new = raw.get(new_section)
        new = dict(new) if isinstance(new, Mapping) else {}
        value = old[key]
        if new_key in new and new[new_key] != value:
            raise CheckpointError(
                f"{source}: config keys '{old_section}.{key}'={value!r} and "
                f"'{new_section}.{new_key}'={new[new_key]!r} disagree; '{old_section}.{key}' "
                f"is the old name of '{new_section}.{new_key}': keep only that one"
            )
        new[new_key] = value
        raw[old_section] = {k: v for k, v in old.items() if k != key}
        raw[new_section] = new
    return raw


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


@cache
def _schema(arch: str) -> DictConfig:
    """The typed training schema with ``arch``'s model schema, built once: building it from the
    dataclasses takes longer than checking a config against it."""
    schema = OmegaConf.structured(TrainConfig)
    schema.model = OmegaConf.structured(MODEL_SCHEMAS[arch])
    return schema


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
    raw = _moved_keys(dict(raw), source)
    arch = _model_arch(raw.get("model"), source)
    raw["model"] = {k: v for k, v in raw["model"].items() if k != "_target_"} | {"arch": arch}
    try:
        cfg = OmegaConf.merge(_schema(arch), raw)  # merge copies the schema: it stays as built
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # no missing value
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{source}: config key {key!r} is invalid: {reason}") from None
    try:
        check_train_config(cfg, training=False)
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

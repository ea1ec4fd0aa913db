"""Test utilities: composing the project's Hydra configs and making small real corpora."""

from __future__ import annotations

import gzip
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from nmt.runtime import CONFIG_DIR


def compose_config(name: str, overrides: list[str] | None = None) -> DictConfig:
    """Compose configs/<name>.yaml with overrides, as the command line would."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name=name, overrides=overrides or [])


def write_subset(mirror: Path, out: Path, split: str, n: int, langs=("de", "en"), start=0) -> Path:
    """Write lines [start, start+n) of a Multi30k split as plain files; returns the prefix."""
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / f"{split}{start}_{n}"
    for lang in langs:
        with gzip.open(mirror / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")[start : start + n]
        (Path(f"{prefix}.{lang}")).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return prefix

"""Test utilities: composing the project's Hydra configs and making small real corpora."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from nmt.cli import CONFIG_DIR
from nmt.config import register_configs

REPO = Path(__file__).resolve().parents[1]


def compose_config(name: str, overrides: list[str] | None = None) -> DictConfig:
    """Compose configs/<name>.yaml with overrides, as the command line would."""
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name=name, overrides=overrides or [])


def write_subset(
    multi30k: Path, out: Path, split: str, n: int, langs=("de", "en"), start=0
) -> Path:
    """Write lines [start, start+n) of a Multi30k split (from the ``multi30k`` directory of .gz
    files) as plain files; returns the prefix."""
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / f"{split}{start}_{n}"
    for lang in langs:
        with gzip.open(multi30k / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")[start : start + n]
        (Path(f"{prefix}.{lang}")).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return prefix


def write_file(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path``, gzipped when the name ends in .gz; returns the path."""
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


TINY_TRANSFORMER = [
    "model=transformer",
    "model.d_model=64",
    "model.heads=4",
    "model.d_ff=128",
    "model.enc_layers=1",
    "model.dec_layers=1",
]


# runs whose results must match exactly: no dropout, on the CPU
DETERMINISTIC = ("model.dropout=0.0", "model.attn_dropout=0.0", "trainer.device=cpu")


def corpus_overrides(corpus: Path, root: Path) -> list[str]:
    """A de->en `parallel` data config training, validating and testing on one small corpus."""
    return [
        "data=parallel",
        "data.src_lang=de",
        "data.tgt_lang=en",
        f"data.train={corpus}",
        f"data.valid={corpus}",
        f"data.test=[{corpus}]",
        f"data.root={root / 'data'}",
        "data.vocab_size=600",
    ]


def tiny_run_overrides(corpus: Path, tmp_path: Path, *extra: str) -> list[str]:
    """Overrides for a seconds-long run on a small real corpus written by write_subset."""
    return [
        *corpus_overrides(corpus, tmp_path),
        "data.max_tokens=600",
        f"outputs={tmp_path / 'outputs'}",
        "trainer.val_sentences=20",
        "trainer.log_every=5",
        "trainer.progress=false",
        "trainer.attention_sentences=0",
        "trainer.precision=32",  # auto measures: two runs of one test could differ
        *TINY_TRANSFORMER,
        *extra,
    ]


def run_in_process(prefix: Path, work: Path, name: str, *extra: str) -> dict[str, Any]:
    """A seconds-long training run on one thread in this process (into
    ``work/outputs/runs/name``); returns train()'s result."""
    from nmt.train.command import train

    cfg = compose_config("train", tiny_run_overrides(prefix, work, "trainer.threads=1", *extra))
    return train(cfg, work / "outputs" / "runs" / name)


def save_screenshot(page: Any, folder: Path, name: str, full_page: bool = True) -> Path:
    """A browser page's screenshot into ``folder``, and also into $NMT_SCREENSHOTS_TO when it
    is set (to keep them)."""
    path = folder / name
    page.screenshot(path=str(path), full_page=full_page)
    target = os.environ.get("NMT_SCREENSHOTS_TO")
    if target:
        shutil.copy(path, Path(target) / name)
    return path

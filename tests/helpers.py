"""Test utilities: composing the project's Hydra configs and making small real corpora."""

from __future__ import annotations

import fcntl
import gzip
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from nmt.cli import CONFIG_DIR
from nmt.config import register_configs
from nmt.store.gate import load_run_config
from nmt.viz.visualize import flatten_config

REPO = Path(__file__).resolve().parents[1]


def compose_config(name: str, overrides: list[str] | None = None) -> DictConfig:
    """Compose configs/<name>.yaml with overrides, as the command line would."""
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name=name, overrides=overrides or [])


def differences_from_preset(run: Path, overrides: list[str], ignored: set[str]) -> set[str]:
    """The dotted config keys (outside ``ignored``) where an archived run's ``config.yaml``, read
    as a resumed run reads it (keys the schema gained since take their defaults), differs from
    the training config that ``overrides`` compose."""
    preset = flatten_config(
        OmegaConf.to_container(compose_config("train", overrides), resolve=True)
    )
    archived = flatten_config(OmegaConf.to_container(load_run_config(run), resolve=True))
    return {
        key
        for key in preset.keys() | archived.keys()
        if key not in ignored and preset.get(key) != archived.get(key)
    }


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


def data_cfg(train: object, root: Path, **overrides: object) -> Any:
    """A `parallel` de->en data config (600 pieces, one worker) training on ``train`` (corpus
    prefixes, weighted or not) and validating on its first corpus."""
    from nmt.config import DataConfig
    from nmt.config_checks import train_corpora

    first = train_corpora(train)[0].prefix
    cfg = DataConfig(
        name="t", corpus="parallel", src_lang="de", tgt_lang="en", root=str(root),
        train="x", valid=first, test=[], vocab_size=600, num_workers=1,
    )  # fmt: skip
    merged = OmegaConf.merge(OmegaConf.structured(cfg), overrides)
    merged.train = train
    return merged


def in_memory(prefix: Path, tokenizers: Any, max_len: int = 100, ratio: float = 3.0):
    """The training split of a de/en corpus as the in-memory pipeline made it: ids of the kept
    pairs, and the cleaning and filtering stats."""
    import numpy as np

    from nmt.data.corpus import clean_pairs, read_parallel
    from nmt.data.splits import filter_by_length

    src, tgt, stats = clean_pairs(*read_parallel(f"{prefix}.de", f"{prefix}.en"))
    src_ids, tgt_ids = tokenizers.src.encode_batch(src), tokenizers.tgt.encode_batch(tgt)
    lens = [np.array([len(ids) for ids in side]) for side in (src_ids, tgt_ids)]
    keep, drops = filter_by_length(*lens, max_len, ratio)
    stats.update(drops, kept=len(keep))
    return [src_ids[i] for i in keep], [tgt_ids[i] for i in keep], stats


MULTI_DIRECTIONS = ["de-en", "en-de", "en-fr", "fr-en"]  # the runs of multilingual_runs

TINY_TRANSFORMER = [
    "model=transformer",
    "model.d_model=64",
    "model.heads=4",
    "model.d_ff=128",
    "model.enc_layers=1",
    "model.dec_layers=1",
]


# a run of a few updates that draws and prints nothing, on one thread, in fp32
QUIET_TINY_RUN = ("trainer.progress=false", "trainer.attention_sentences=0",
                  "trainer.precision=32", "data.max_tokens=400", "trainer.threads=1")  # fmt: skip

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


def made_once(root: Path, name: str, make: Callable[[Path], object]) -> Path:
    """The folder ``root/name``, filled by ``make(folder)`` once: under a lock, by the first
    process to ask (with ``root`` the folder of the whole run, ``shared_tmp``: the first
    worker of ``make test``); the others wait for it and find it made."""
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".made").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            make(folder)
            (folder / ".made").touch()
    return folder


def save_screenshot(page: Any, folder: Path, name: str, full_page: bool = True) -> Path:
    """A browser page's screenshot into ``folder``, and also into $NMT_SCREENSHOTS_TO when it
    is set (to keep them)."""
    path = folder / name
    page.screenshot(path=str(path), full_page=full_page)
    target = os.environ.get("NMT_SCREENSHOTS_TO")
    if target:
        shutil.copy(path, Path(target) / name)
    return path


def assert_identical(a: Any, b: Any, where: str = "payload") -> None:
    """Bit-for-bit equality of nested checkpoint contents."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_identical(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def training_outcome(payload: dict[str, Any]) -> dict[str, Any]:
    """What must match between runs: all of a checkpoint except wall-clock timings."""
    state = {k: v for k, v in payload["state"].items() if k != "train_time"}
    state["history"] = [
        {k: v for k, v in h.items() if k != "seconds"} for h in payload["state"]["history"]
    ]
    keys = ("model", "optimizer", "scheduler", "scaler", "rng", "tokenizers")
    return {"state": state, **{k: payload[k] for k in keys}}


def saved_random_model(
    model_class: Any,
    config: Any,
    folder: Path,
    seed: int,
    embeddings: str = "shared",
    output_bias: bool = False,
) -> None:
    """A random transformers model of ``config`` saved into ``folder``, with weights that make
    varied outputs: an output bias (``output_bias``: Marian's ``final_logits_bias``) of scale
    0.2, layer-norm scales around 1, embeddings (the parameters named ``embeddings``) of unit
    scale, matrices large."""
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        if output_bias:
            model.final_logits_bias.normal_(0.0, 0.2)
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.uniform_(0.5, 1.5)
            elif embeddings in name:
                p.normal_(0.0, 1.0)
            elif p.dim() == 2:
                torch.nn.init.xavier_uniform_(p, gain=3.0)
    model.save_pretrained(folder)

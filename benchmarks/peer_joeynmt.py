"""JoeyNMT 2.3.0 as a peer of ``make bench-peers`` (:mod:`benchmarks.peers_common`).

Its configs are the ones of ``make bench-joeynmt`` (``scripts/joeynmt/transformer.yaml`` and
``rnn.yaml``), pointed at the shared workspace, with token batches for both models so that
every toolkit trains on the same target tokens per update.

JoeyNMT's token batches fill up to ``batch_size`` padded tokens, counting each sentence as
``max(source, target) + 1`` tokens times the batch's sentences; the target tokens it trains
on are fewer. The asked target tokens per update are turned into a ``batch_size`` by
:data:`PADDED_PER_TARGET`: its sampler replayed over shuffled epochs of Multi30k de-en with
the shared sentencepiece model gives 3,447 target tokens per update at ``batch_size`` 8,800.

Its log has a line per ``logging_freq`` updates with a millisecond timestamp and "Tokens per
Sec" over the window (non-padding target tokens, EOS included); the windows' seconds are the
gaps between consecutive timestamps, starting at its "EPOCH 1" line.
"""

from __future__ import annotations

import re
import signal
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from benchmarks.peers_common import (
    NATIVE,
    Command,
    Decoding,
    RecipeJob,
    TrainJob,
    Window,
    Workspace,
    command,
)

NAME = "joeynmt"
VERSION = "2.3.0"
REQUIREMENTS = (
    ("torch==2.13.0", "joeynmt==2.3.0", "importlib_metadata"),
    # 2.3.0 calls SentencePieceProcessor.SetVocabulary, which newer releases dropped
    ("--only-binary", ":all:", "sentencepiece==0.2.0"),
)
PROBE = (
    "import json, torch, joeynmt, sentencepiece; print(json.dumps({'joeynmt': "
    "joeynmt.__version__, 'torch': torch.__version__, 'sentencepiece': "
    "sentencepiece.__version__}))"
)
# fp16 needs CUDA in JoeyNMT 2.3.0; on a CPU it trains in fp32 only
PRECISIONS = {"transformer": ("32",), "gru": ("32",)}
CONFIGS = Path(__file__).resolve().parents[1] / "scripts" / "joeynmt"
STEMS = {"transformer": "transformer", "gru": "rnn"}
PADDED_PER_TARGET = 2.55  # batch_size per target token trained; its sampler over an epoch
DIFFERENCES = {
    "transformer": [
        "Adam betas 0.9/0.98 and inverse-square-root warmup over 100 updates (ours: 4,000 "
        "warmup updates in the default optimizer; the speed of a step does not depend on it)",
        "batches fill by padded tokens in shuffled order, not by length buckets: more padding "
        "per target token than ours",
        "no fused or blockwise loss, no bf16 on a CPU",
    ],
    "gru": [
        "dropout 0.3 and input feeding (the attention vector fed to the next decoder step), "
        "a bridge layer for the decoder's first state; ours: no input feeding",
        "untied embeddings and output layer (ours ties the target embedding and the output)",
        "label smoothing 0 (ours 0.1)",
    ],
}


def _write(path: Path, cfg: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def workspace_config(stem: str, work: Path, seed: int, ws: Workspace) -> dict[str, Any]:
    """``scripts/joeynmt/<stem>.yaml`` reading the workspace's files, its model under
    ``work/model``, on the CPU in fp32, seeded with ``seed``."""
    cfg = yaml.safe_load((CONFIGS / f"{stem}.yaml").read_text(encoding="utf-8"))
    data = cfg["data"]
    data["train"] = str(ws.root / "data" / "train")
    data["dev"] = str(ws.root / "data" / "val300")
    data["test"] = str(ws.root / "data" / "test_2016_flickr")
    for side in ("src", "trg"):
        data[side]["voc_file"] = str(ws.spm_vocab)
        data[side]["tokenizer_cfg"]["model_file"] = str(ws.spm_model)
    cfg.update(model_dir=str(work / "model"), use_cuda=False, fp16=False, random_seed=seed)
    cfg["training"]["random_seed"] = seed
    return cfg


def joey_train(python: Path, work: Path, threads: int, config: Path) -> Command:
    """``python -m joeynmt train CONFIG -t`` (``-t``: no test decoding at the end)."""
    argv = [str(python), "-m", "joeynmt", "train", str(config), "-t"]
    return command(argv, work, "train.log", threads)


def write_config(job: TrainJob, ws: Workspace) -> Path:
    """JoeyNMT's config for ``job`` under ``job.work``."""
    cfg = workspace_config(STEMS[job.model], job.work, job.seed, ws)
    cfg["training"].update(
        updates=job.steps,
        logging_freq=job.log_every,
        validation_freq=10 * job.steps + 10**6,
        batch_size=round(job.tgt_tokens_per_step * PADDED_PER_TARGET),
        batch_type="token",
        overwrite=True,
    )
    return _write(job.work / "config.yaml", cfg)


def train_command(python: Path, job: TrainJob, ws: Workspace) -> Command:
    """JoeyNMT's training on :func:`write_config`."""
    return joey_train(python, job.work, job.threads, write_config(job, ws))


STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
STEP_LINE = re.compile(STAMP + r".*Step:\s+(\d+), .*Tokens per Sec:\s+([\d.]+)")
EPOCH_LINE = re.compile(STAMP + r".*joeynmt\.training - EPOCH 1\b")


def _stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def parse_train_log(text: str) -> list[Window]:
    """JoeyNMT's logging windows: seconds between consecutive timestamps (the first window
    starts at "EPOCH 1"), target tokens = its window rate times those seconds."""
    windows: list[Window] = []
    previous: tuple[int, float] | None = None
    for line in text.splitlines():
        m = EPOCH_LINE.match(line)
        if m and previous is None:
            previous = (0, _stamp(m.group(1)))
            continue
        m = STEP_LINE.match(line)
        if m and previous is not None:
            step, t = int(m.group(2)), _stamp(m.group(1))
            seconds = t - previous[1]
            windows.append(Window(step, step - previous[0], seconds, float(m.group(3)) * seconds))
            previous = (step, t)
    if not windows:
        raise ValueError("no 'EPOCH 1' line followed by 'Step: ... Tokens per Sec' lines")
    return windows


# ------------------------------------------------------------------------------ its recipe

RECIPE = {
    "source": "configs/iwslt14_deen_bpe.yaml of joeynmt 2.3 (its benchmarks page: IWSLT14 "
    "de-en, Transformer 6+6, width 256, 4 heads, FFN 1,024, test BLEU 33.73)",
    "kept": "pre-norm, tied embeddings and softmax, xavier_uniform; dropout 0.3 in the layers, "
    "0 on the embeddings; AdamW 0.9/0.999, lr 3e-4, no warmup, no gradient clipping; label "
    "smoothing 0.1; token batches of 4,096 (padded); greedy validation BLEU, best checkpoint; "
    "beam 5, alpha 1.0",
    "adapted": [
        "3+3 layers (the recipe: 6+6), the shape every toolkit trains here",
        "the learning rate is constant: the recipe's plateau schedule crashes in 2.3.0 with "
        "torch 2.13 (ReduceLROnPlateau's verbose argument), and within 30 minutes it would "
        "only lower the rate after 5 validations without a gain",
        "validation every 200 updates on the first 300 validation sentences (the recipe: "
        "1,000 on all), cased text and the shared sentencepiece model (the recipe: lowercased, "
        "subword-nmt)",
        "stopped by SIGINT at the deadline: JoeyNMT saves a last checkpoint and the best "
        "validation checkpoint is decoded",
    ],
}
STOP_SIGNAL = signal.SIGINT


def recipe_config(job: RecipeJob, ws: Workspace) -> dict[str, Any]:
    cfg = workspace_config("transformer", job.work, job.seed, ws)
    for side in ("src", "trg"):
        cfg["data"][side].update(lowercase=False, max_length=100)
    train = cfg["training"]
    for key in ("learning_rate_warmup", "clip_grad_norm"):
        train.pop(key, None)
    train.update(
        optimizer="adamw",
        adam_betas=[0.9, 0.999],
        learning_rate=3e-4,
        scheduling="exponential",  # decrease_factor 1: constant
        decrease_factor=1.0,
        weight_decay=0.0,
        label_smoothing=0.1,
        batch_size=4096,
        batch_type="token",
        epochs=1000,
        validation_freq=200,
        logging_freq=50,
        early_stopping_metric="bleu",
        keep_best_ckpts=5,
        overwrite=True,
    )
    for part in ("encoder", "decoder"):
        cfg["model"][part]["dropout"] = 0.3
        cfg["model"][part]["embeddings"]["dropout"] = 0.0
    cfg["testing"].update(beam_size=5, beam_alpha=1.0, max_output_length=100)
    return cfg


def recipe_command(python: Path, job: RecipeJob, ws: Workspace) -> Command:
    """JoeyNMT's recipe, trained until the harness interrupts it."""
    config = _write(job.work / "recipe.yaml", recipe_config(job, ws))
    return joey_train(python, job.work, job.threads, config)


ENGINES = (NATIVE,)  # JoeyNMT's own search; CTranslate2 has no JoeyNMT converter


def decode_command(python: Path, job: RecipeJob, ws: Workspace, d: Decoding) -> Command:
    """``joeynmt translate`` of ``d.src`` (standard input) with the best checkpoint at
    ``d.beam`` (the recipe's config with that beam, batches of one sentence when
    ``d.one_at_a_time``);
    the detokenized output on standard output (``-o`` fails after decoding in 2.3.0)."""
    config = job.work / "recipe.yaml"
    if d.beam != 5 or d.one_at_a_time:
        cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
        cfg["testing"]["beam_size"] = d.beam
        if d.one_at_a_time:
            cfg["testing"].update(batch_size=1, batch_type="sentence")
        name = f"recipe-beam{d.beam}{'-one' if d.one_at_a_time else ''}.yaml"
        config = _write(job.work / name, cfg)
    return command(
        [str(python), "-m", "joeynmt", "translate", str(config)],
        job.work,
        "decode.log",
        job.threads,
        stdout=d.out,
        stdin=d.src,
    )

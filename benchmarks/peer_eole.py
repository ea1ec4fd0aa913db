"""Eole (the successor of OpenNMT-py) as a peer of ``make bench-peers``.

Eole reads the workspace's raw text and segments it on the fly with its ``sentencepiece``
transform (the joint 8k model). Its vocabulary is the model's ``.vocab`` file read as
token-only lines; with ``pad_token: <pad>`` all four of Eole's special tokens (unk, pad, bos,
eos = ``<unk> <pad> <s> </s>``) are already pieces 0-3 of that file, so Eole adds none and its
ids are the sentencepiece ids (8000, a multiple of ``vocab_size_multiple`` 8: no filler).

Batch size. With ``batch_type: tokens`` Eole closes a batch when sentences x the longest side
(source pieces, or target pieces + BOS + EOS) reaches ``batch_size``; batches are cut from the
corpus sorted by source length. The target tokens it trains on (pieces + EOS, padding left
out: the ``bsz`` column's middle figure) come to :data:`TGT_TOKENS_PER_BATCH_TOKEN` of
``batch_size`` on Multi30k de-en (0.81 over a simulation of its batching of the training
set, 0.80-0.83 for 3.5k-5k; the logged ``bsz`` figures agree), so ``batch_size`` is the job's
target tokens per update divided by that share.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

import yaml

from benchmarks.peers_common import (
    CT2,
    NATIVE,
    Command,
    Decoding,
    RecipeJob,
    TrainJob,
    Window,
    Workspace,
    command,
)

NAME = "eole"
VERSION = "0.6.4"
# the eole command imports every one of its tools at start, one of which needs aiohttp, a
# package eole 0.6.4 does not declare
REQUIREMENTS: tuple[tuple[str, ...], ...] = (
    ("torch==2.13.0",),
    ("eole==0.6.4", "aiohttp==3.14.5"),
)
PROBE = (
    "import json, eole, torch, sentencepiece, pyonmttok; "
    "print(json.dumps({'eole': eole.__version__, 'torch': torch.__version__, "
    "'sentencepiece': sentencepiece.__version__, 'pyonmttok': pyonmttok.__version__}))"
)
# Eole 0.6.4 has a GRU encoder-decoder, but its decoder attends after the recurrent step
# (Luong's input feeding) and needs encoder and decoder of one width, so nmt's GRU + Bahdanau
# model is not offered
PRECISIONS: dict[str, tuple[str, ...]] = {"transformer": ("32", "bf16")}
DIFFERENCES: dict[str, list[str]] = {
    "transformer": [
        "matched: 3+3 pre-norm layers with a final layer norm after each stack, width 256, "
        "4 heads, ReLU FFN 1024, biases on the attention and FFN projections, none on the "
        "output projection; dropout 0.1 on embeddings and sub-layer outputs, 0.1 on attention "
        "weights; interleaved sinusoidal positions, embeddings scaled by sqrt(256); one "
        "embedding matrix for encoder, decoder and output (joint vocabulary of the same 8000 "
        "pieces, same ids); label smoothing 0.1 (torch's cross-entropy); Adam betas "
        "0.9/0.98, eps 1e-9; gradient norm clipped at 1.0; the same 7,578,624 parameters",
        "not matchable: Eole also applies the 0.1 dropout after the FFN's ReLU (its MLP has one "
        "dropout value for both places; nmt has none there)",
        "loss normalization: Eole divides the summed loss by the target tokens less one per "
        "sentence (it subtracts the EOS count; nmt divides by all target tokens, EOS included), "
        "so its gradients are about 7% larger before clipping",
        "schedule: Eole's noam (linear warmup over 800 updates, then 1/sqrt(step)) with its "
        "scale chosen so that the peak is nmt's 1e-3; same shape as nmt's inverse_sqrt",
        "initialization: xavier_uniform on every matrix, the embeddings included "
        "and its pad row (nmt: N(0, 256^-0.5) embeddings with a zero pad row)",
        "batching: Eole counts a batch as sentences x longest side with BOS and EOS on the "
        "target and cuts batches from buckets sorted by source length; its batch size is "
        "converted to the job's target tokens per update (see the module docstring)",
        "data: segmented on the fly by Eole's sentencepiece transform in the training process "
        "(num_workers 0); each pass over the corpus re-segments it, inside the timed windows",
        "bf16: torch CPU autocast (bfloat16) with fp32 weights and a GradScaler "
        "(compute_dtype bf16, use_amp true)",
        "duplicate source sentences within one batch are dropped by Eole's batcher",
    ],
}

TGT_TOKENS_PER_BATCH_TOKEN = 0.81
WARMUP_STEPS = 800
PEAK_LR = 1e-3
WIDTH = 256
DTYPES = {"32": "fp32", "bf16": "bf16"}


def batch_size_for(tgt_tokens_per_step: int) -> int:
    """Eole's token ``batch_size`` that yields about ``tgt_tokens_per_step`` target tokens."""
    return round(tgt_tokens_per_step / TGT_TOKENS_PER_BATCH_TOKEN)


def noam_scale() -> float:
    """Eole's noam ``learning_rate`` whose peak (at the end of warmup) is :data:`PEAK_LR`."""
    return PEAK_LR * WIDTH**0.5 * WARMUP_STEPS**0.5


def train_config(job: TrainJob, ws: Workspace) -> dict[str, Any]:
    """Eole's training config for ``job``: the Transformer, no validation, CPU only."""
    if job.model not in PRECISIONS:
        raise ValueError(f"eole offers no {job.model!r} model here (only {sorted(PRECISIONS)})")
    if job.precision not in PRECISIONS[job.model]:
        raise ValueError(f"eole offers no precision {job.precision!r} for {job.model}")
    with ws.text("train", ws.src).open(encoding="utf-8") as f:
        lines = sum(1 for _ in f)
    never = 100 * job.steps + 10**6
    return {
        "seed": job.seed,
        "report_every": job.log_every,
        "src_vocab": str(ws.spm_vocab),
        "share_vocab": True,
        "src_vocab_size": 8000,
        "tgt_vocab_size": 8000,
        "vocab_size_multiple": 8,
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "decoder_start_token": "<s>",
        "data": {
            "corpus_1": {
                "path_src": str(ws.text("train", ws.src)),
                "path_tgt": str(ws.text("train", ws.tgt)),
                "transforms": ["sentencepiece"],
            }
        },
        "transforms_configs": {
            "sentencepiece": {
                "src_subword_model": str(ws.spm_model),
                "tgt_subword_model": str(ws.spm_model),
            }
        },
        "skip_empty_level": "silent",
        "model": {
            "architecture": "transformer",
            "hidden_size": WIDTH,
            "layers": 3,
            "heads": 4,
            "transformer_ff": 1024,
            "mlp_activation_fn": "relu",
            "layer_norm": "standard",
            "norm_eps": 1e-5,
            "add_qkvbias": True,
            "add_final_linear_bias": True,
            "add_ffnbias": True,
            "generator_bias": False,
            "share_embeddings": True,
            "share_decoder_embeddings": True,
            "embeddings": {
                "word_vec_size": WIDTH,
                "position_encoding_type": "SinusoidalInterleaved",
            },
        },
        "training": {
            "model_path": str(job.work / "model"),
            "keep_checkpoint": 1,
            "save_checkpoint_steps": 0,
            "train_steps": job.steps,
            "valid_steps": never,
            "gpu_ranks": [],
            "world_size": 1,
            "num_workers": 0,
            "bucket_size": lines,
            "batch_type": "tokens",
            "batch_size": batch_size_for(job.tgt_tokens_per_step),
            "batch_size_multiple": 1,
            "accum_count": [1],
            "normalization": "tokens",
            "compute_dtype": DTYPES[job.precision],
            "use_amp": True,
            "self_attn_backend": "pytorch",
            "optim": "adam",
            "adam_beta1": 0.9,
            "adam_beta2": 0.98,
            "adam_eps": 1e-9,
            "learning_rate": noam_scale(),
            "decay_method": "noam",
            "warmup_steps": WARMUP_STEPS,
            "max_grad_norm": 1.0,
            "label_smoothing": 0.1,
            "dropout": [0.1],
            "attention_dropout": [0.1],
            "param_init_method": "xavier_uniform",
        },
    }


def eole_train(python: Path, work: Path, threads: int, cfg: dict[str, Any], name: str) -> Command:
    """Writes ``cfg`` as ``work/name``; the command runs ``eole train`` on it."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / name
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    eole = str(Path(python).parent / "eole")
    return command([eole, "train", "-config", str(config)], work, "train.log", threads)


def train_command(python: Path, job: TrainJob, ws: Workspace) -> Command:
    """``eole train`` on ``eole.yaml`` (:func:`train_config`) under ``job.work``."""
    return eole_train(python, job.work, job.threads, train_config(job, ws), "eole.yaml")


# "Step 5/   30; acc: ...; bsz: 3470/3533/226; 1416/1442 tok/s;     12 sec;"
STEP_LINE = re.compile(
    r"\bStep\s+(\d+)(?:/\s*\d+)?;.*?\bbsz:\s*(\d+)/\s*(\d+)/\s*(\d+);"
    r"\s*(\d+)/\s*(\d+) tok/s;"
)


def parse_train_log(text: str) -> list[Window]:
    """The windows of an Eole training log, one per ``Step N/M`` line.

    A line reports the updates since the previous line (the first since step 0) from Eole's
    statistics for that window alone: the ``bsz`` column is src/tgt/sentences per batch, the
    target figure being its mean non-padding target tokens (EOS included, BOS not), and
    ``tok/s`` is src/tgt tokens over the seconds since the previous report (measured with
    ``time.time()``, the window's statistics start right after the previous line). So the
    window's target tokens are the tgt bsz x its updates (one batch per update: no gradient
    accumulation), exact when each line covers one update (with more, the mean is rounded
    to a whole token), and its seconds are those tokens / the tgt tok/s, which keeps Eole's
    own rate (rounded to 1 tok/s only). The line's timestamps have millisecond resolution
    but also count the logging itself; the rate is the finer and Eole's own figure.
    """
    windows: list[Window] = []
    previous = 0
    for line in text.splitlines():
        m = STEP_LINE.search(line)
        if m is None:
            continue
        step = int(m.group(1))
        tgt_per_batch, tgt_rate = float(m.group(3)), float(m.group(6))
        steps = step - previous
        if steps <= 0:
            raise ValueError(f"eole log: step {step} does not follow step {previous}")
        if tgt_rate <= 0:
            raise ValueError(f"eole log: step {step} reports {tgt_rate} target tokens/s")
        tokens = tgt_per_batch * steps
        windows.append(Window(step=step, steps=steps, seconds=tokens / tgt_rate, tgt_tokens=tokens))
        previous = step
    if not windows:
        raise ValueError("no 'Step N/M; ... bsz: ...; .../... tok/s' line in the eole log")
    return windows


# ------------------------------------------------------------------------------ its recipe

RECIPE = {
    "source": "recipes/wmt17 of eole (wmt17_ende.yaml, wmt17_ende_spm.yaml): its only "
    "translation training recipe; nothing for small corpora",
    "kept": "AdamW with beta2 0.998, noam decay, no gradient clipping, dropout and attention "
    "dropout 0.1, label smoothing 0.1, xavier_uniform, token batches normalised by tokens, "
    "bf16 compute; beam 5 with Eole's default length penalty (avg, alpha 1)",
    "adapted": [
        "3+3 layers, width 256, 4 heads, FFN 1,024 (the recipe: 6 layers of 1,024)",
        "warm-up 100 updates (the recipe: 4,000 of 50,000, which 30 minutes never reach) with "
        "the noam factor 0.316, whose peak 1.98e-3 is what the recipe's factor 2 gives at "
        "width 256 after its warm-up",
        "batches of about 3,500 target tokens, no accumulation (the recipe: 5,000 x 10, about "
        "100 updates in 30 minutes)",
        "no validation (it selects no checkpoint in Eole); a checkpoint every 50 updates, "
        "the run stopped at the deadline and its newest complete checkpoint decoded",
    ],
}
STOP_SIGNAL = signal.SIGTERM
RECIPE_WARMUP = 100
RECIPE_NOAM_FACTOR = 0.316


def recipe_config(job: RecipeJob, ws: Workspace) -> dict[str, Any]:
    base = TrainJob("transformer", "bf16", 10**7, 3500, job.threads, job.work, 50, job.seed)
    cfg = train_config(base, ws)
    cfg["training"].update(
        optim="adamw",
        adam_beta2=0.998,
        adam_eps=1e-8,
        learning_rate=RECIPE_NOAM_FACTOR,
        warmup_steps=RECIPE_WARMUP,
        max_grad_norm=0.0,
        save_checkpoint_steps=50,
        keep_checkpoint=2,
    )
    return cfg


def recipe_command(python: Path, job: RecipeJob, ws: Workspace) -> Command:
    """``eole train`` on the adapted recipe, until the harness stops it."""
    return eole_train(python, job.work, job.threads, recipe_config(job, ws), "recipe.yaml")


BATCHED = ["-batch_size", "4096", "-batch_type", "tokens"]


def newest_checkpoint(model: Path) -> Path:
    """The newest ``step_N`` folder whose ``config.json`` (written last) is there."""
    done = [
        p for p in model.glob("step_*") if p.name[5:].isdigit() and (p / "config.json").exists()
    ]
    if not done:
        raise FileNotFoundError(f"no complete step_N checkpoint in {model}")
    return max(done, key=lambda p: int(p.name[5:]))


# Eole's own search; CTranslate2 on CTranslate2's own converter of Eole checkpoints
# (ctranslate2.converters.eole_ct2), decoded by ``eole predict -engine ct2``
ENGINES = (NATIVE, CT2)
CT2_DIR = "ctranslate2"  # where ``-engine ct2`` looks, inside the checkpoint folder


def convert_command(python: Path, job: RecipeJob, ws: Workspace) -> Command:
    """CTranslate2's converter of the newest complete checkpoint, into its ``ctranslate2``
    folder, in float32 (the recipe's checkpoints hold bfloat16 weights, which CTranslate2's
    CPU backend would convert when loading)."""
    ckpt = newest_checkpoint(job.work / "model")
    argv = [str(python), "-m", "ctranslate2.converters.eole_ct2", "--model_path", str(ckpt)]
    argv += ["--output_dir", str(ckpt / CT2_DIR), "--quantization", "float32", "--force"]
    return command(argv, job.work, "convert.log", job.threads)


def decode_command(python: Path, job: RecipeJob, ws: Workspace, d: Decoding) -> Command:
    """``eole predict`` of ``d.src`` with the newest complete checkpoint at ``d.beam`` (by
    CTranslate2 on :func:`convert_command`'s model for engine :data:`CT2`); the
    sentencepiece transform segments the source and joins the output's pieces."""
    return command(
        [
            str(Path(python).parent / "eole"),
            "predict",
            "-model_path",
            str(newest_checkpoint(job.work / "model")),
            # Eole's default top_k 0 (no sampling) reaches CTranslate2 as its sampling_topk,
            # where 0 samples from the whole distribution, also in beam search: 1 is argmax
            *(["-engine", "ct2", "-top_k", "1"] if d.engine == CT2 else []),
            "-src",
            str(d.src),
            "-output",
            str(d.out),
            "-beam_size",
            str(d.beam),
            *(["-batch_size", "1", "-batch_type", "sents"] if d.one_at_a_time else BATCHED),
            # the checkpoint records the transform's models but not that the source needs it
            "-transforms",
            "sentencepiece",
        ],
        job.work,
        "decode.log",
        job.threads,
    )

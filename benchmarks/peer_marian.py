"""Marian (the ``pymarian`` wheel) as a peer of ``make bench-peers`` (:mod:`benchmarks.peers`).

The wheel ships Marian's C++ trainer as a Python extension; ``python -m pymarian ARGS`` is the
``marian`` training command. :func:`train_command` writes the options as ``marian.yml`` (JSON,
which YAML reads) under the job's folder, with the workspace's sentencepiece model copied to
``vocab.spm`` (Marian takes a sentencepiece model as vocabulary when its name ends in ``.spm``;
it reads ``</s>`` and ``<unk>`` from the model, ids 3 and 0 here, adds no ``<s>``, and fills the
gaps of a batch with ``</s>`` under a zero mask, so ``<pad>`` and ``<s>`` are unused rows).

Marian on a CPU: ``--cpu-threads N`` makes N workers of one thread each. Without ``--sync-sgd``
they train asynchronously, each on its own batch, updating shared weights (their windows'
seconds alternate, and updates in flight are logged past ``--after-batches``: 20 lines for 16);
with ``--sync-sgd`` (used here) every batch is split across the N workers and their gradients
summed, one update per batch, as nmt does with N torch threads.
Its CPU backend computes in float32 only: ``--precision float16`` aborts ("Unsupported type for
element-wise operation: float16") and ``bfloat16`` is not a type it knows.

Batches: ``--mini-batch-words W`` closes a batch once its *source* tokens (``</s>`` included)
exceed W (Marian's ``BatchGenerator``), from pools of 64 x 100 sentences sorted by target
length, the last batch of a pool smaller. It has no target-side budget, so W is the job's
target budget times :data:`SRC_PER_TGT`, the source/target token ratio of the training text.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
from pathlib import Path
from typing import Any

from benchmarks.peers_common import (
    NATIVE,
    SHAPE,
    Command,
    Decoding,
    RecipeJob,
    TrainJob,
    Window,
    Workspace,
    command,
)

NAME = "marian"
VERSION = "1.12.42"
# pymarian pulls pyyaml, tqdm, requests, portalocker and huggingface-hub (no torch); the wheel
# itself is ~1 GB (Marian with CUDA and MKL linked in)
REQUIREMENTS: tuple[tuple[str, ...], ...] = ((f"pymarian=={VERSION}",),)
PROBE = (
    "import json, platform, pymarian; "
    "print(json.dumps({'pymarian': pymarian.__version__, 'python': platform.python_version()}))"
)
PRECISIONS: dict[str, tuple[str, ...]] = {"transformer": ("32",), "gru": ("32",)}
MARIAN_PRECISION = {"32": ["float32", "float32"]}

# source / target tokens, </s> included, of Multi30k train (de 470,058, en 454,234) in the
# joint 8k model: --mini-batch-words counts source tokens, the job asks for target tokens
SRC_PER_TGT = 470058 / 454234

_COMMON = [
    "Marian's --cpu-threads N runs N one-thread workers; with --sync-sgd each batch is split "
    "between them and their gradients summed (data parallel), where nmt runs one batch on N "
    "torch threads",
    "batches: --mini-batch-words counts source tokens (scaled by SRC_PER_TGT to aim at the "
    "target budget), drawn from pools of 6,400 sentences sorted by target length; nmt counts "
    "sentences x longest side, padding included",
    "loss: Marian's ce-sum (summed over labels) with clip-norm 1; nmt's mean over target "
    "tokens, clip 1",
    "the first logged window also holds Marian's graph construction and data shuffling",
]
DIFFERENCES: dict[str, list[str]] = {
    "transformer": [
        "the same shape: 3+3 layers, width 256, 4 heads, FFN 1024 (ReLU), pre-norm with a final "
        "norm (--transformer-preprocess n, postprocess da, postprocess-top n), sinusoidal "
        "positions, all three embeddings tied, no output bias, dropout 0.1 on sub-layer outputs, "
        "attention weights and embeddings, label smoothing 0.1",
        "Marian scales embeddings by sqrt(width) and initialises with Glorot uniform; nmt's "
        "initialisation is its own",
        "Adam 0.9/0.98 eps 1e-9, lr 1e-3, 800 warm-up updates then inverse square root, as nmt",
        *_COMMON,
    ],
    "gru": [
        "encoder: 1-layer bidirectional GRU, embeddings 256, 512 per direction, as nmt",
        "decoder: Marian's conditional GRU (Nematus): GRU(y_t-1) -> additive attention queried "
        "with that new state -> second GRU over the context; nmt queries attention with s_t-1 "
        "and runs one GRU cell over [E y_t-1; c_t]",
        "initial decoder state: tanh of a projection of the mean encoder state (nmt: of the "
        "last forward and first backward states)",
        "output: tanh deep-output layer of size 256 over [s_t; c_t; E y_t-1], then the "
        "vocabulary projection with bias (nmt: a linear pre-output layer, no tanh)",
        "dropout: --dropout-rnn 0.3 (variational, on GRU inputs and states); nmt drops 0.3 on "
        "embeddings, encoder outputs and the pre-output layer",
        "embeddings not tied (as nmt's default), label smoothing 0.1, Adam 0.9/0.98, lr 1e-3, "
        "800 warm-up updates",
        *_COMMON,
    ],
}


def model_options(model: str) -> dict[str, Any]:
    """Marian's options for nmt's ``model`` shape (:data:`SHAPE`)."""
    if model == "transformer":
        t = SHAPE["transformer"]
        return {
            "type": "transformer",
            "enc-depth": t["layers"],
            "dec-depth": t["layers"],
            "dim-emb": t["width"],
            "transformer-heads": t["heads"],
            "transformer-dim-ffn": t["ffn"],
            "transformer-ffn-activation": "relu",
            "transformer-preprocess": "n",
            "transformer-postprocess": "da",
            "transformer-postprocess-emb": "d",
            "transformer-postprocess-top": "n",
            "transformer-dropout": t["dropout"],
            "transformer-dropout-attention": t["dropout"],
            "tied-embeddings-all": True,
            "output-omit-bias": True,
            "label-smoothing": t["label_smoothing"],
        }
    if model == "gru":
        g = SHAPE["gru"]
        return {
            "type": "s2s",
            "enc-type": "bidirectional",
            "enc-cell": "gru",
            "dec-cell": "gru",
            "enc-depth": 1,
            "dec-depth": 1,
            "dim-emb": g["embedding"],
            "dim-rnn": g["hidden"],
            "dropout-rnn": 0.3,
            "label-smoothing": 0.1,
        }
    raise ValueError(f"Marian has no model {model!r} here (transformer or gru)")


def train_options(job: TrainJob, ws: Workspace, vocab: Path) -> dict[str, Any]:
    """All options of one training segment: model, data, batches, schedule, no validation."""
    if job.precision not in MARIAN_PRECISION:
        raise ValueError(f"Marian trains on a CPU in float32 only, not {job.precision!r}")
    return {
        **model_options(job.model),
        "model": str(job.work / "model.npz"),
        "no-reload": True,
        "overwrite": True,
        "train-sets": [str(ws.text("train", ws.src)), str(ws.text("train", ws.tgt))],
        "vocabs": [str(vocab), str(vocab)],
        "max-length": 100,
        "mini-batch-words": round(job.tgt_tokens_per_step * SRC_PER_TGT),
        "mini-batch-fit": False,
        "cpu-threads": job.threads,
        "sync-sgd": True,
        "data-threads": 1,
        "shuffle-in-ram": True,
        "tempdir": str(job.work),
        "after-batches": job.steps,
        "disp-freq": f"{job.log_every}u",
        "disp-label-counts": True,
        "cost-type": "ce-sum",
        "save-freq": "0",
        "valid-freq": "0",
        "precision": MARIAN_PRECISION[job.precision],
        "optimizer": "adam",
        "optimizer-params": [0.9, 0.98, 1e-9],
        "learn-rate": 1e-3,
        "lr-warmup": "800u",
        "lr-decay-inv-sqrt": ["800u"],
        "clip-norm": 1.0,
        "seed": job.seed,
    }


def train_command(python: Path, job: TrainJob, ws: Workspace) -> Command:
    """Write ``vocab.spm`` and ``marian.yml`` under ``job.work``; the command trains
    ``job.steps`` updates with them and saves the model only once, at the end (Marian's final
    save cannot be turned off)."""
    return marian_train(python, job.work, job.threads, ws, train_options, job, "marian.yml")


def marian_train(python, work, threads, ws, options, job, name) -> Command:
    """Copy the sentencepiece model to ``work/vocab.spm``, write ``options(job, ws, vocab)``
    as ``work/name``; the command trains with it."""
    work.mkdir(parents=True, exist_ok=True)
    vocab = work / "vocab.spm"
    shutil.copyfile(ws.spm_model, vocab)
    config = work / name
    config.write_text(json.dumps(options(job, ws, vocab), indent=1) + "\n")
    argv = [str(python), "-m", "pymarian", "--config", str(config)]
    return command(argv, work, "train.log", threads)


UPDATE_LINE = re.compile(
    r"Ep\. [\d.]+ : Up\. (?P<up>\d+) : Sen\. [\d,]+ : Cost \S+"
    r"(?: \* (?P<labels>[\d,]+)(?: @ [\d,]+)? after (?P<after>[\d,]+))? : "
    r"Time (?P<secs>[\d.]+)s : (?P<rate>[\d.]+) words/s"
)


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_train_log(text: str) -> list[Window]:
    """The windows of a Marian training log, one per ``Ep. E : Up. N : ...`` line.

    Marian (``Scheduler::update``, cost type ce-sum with label counts shown) prints
    ``Cost C * L @ B after T : Time S s : R words/s``:

    * ``L``: the target labels of the updates since the previous line (the cost's count:
      the non-padding target tokens, ``</s>`` included, summed over the window's batches);
    * ``B``: the labels of the line's last batch only; ``T``: labels since training began;
    * ``S``: seconds since the previous line (a timer restarted at every line; the first
      line's also counts graph construction and the data shuffle);
    * ``R``: the window's target labels divided by ``S`` (``words/s`` counts target labels).

    A window is: its update ``N``, ``N`` minus the previous line's, ``S`` (printed to 10 ms)
    and ``L`` (exact; ``R * S`` is not, both being rounded). ``L`` equals the step of ``T``
    between two lines, and ``B`` equals ``L`` only for windows of one update. A mean cost
    (``ce-mean-words``, the recipes') is printed without ``* L @ B after T``: there the
    window's labels are ``R * S``."""
    windows: list[Window] = []
    previous = 0
    for match in UPDATE_LINE.finditer(text):
        step = int(match["up"])
        if step <= previous:
            raise ValueError(f"Marian log: update {step} after update {previous}")
        seconds = float(match["secs"])
        labels = _int(match["labels"]) if match["labels"] else float(match["rate"]) * seconds
        windows.append(Window(step, step - previous, seconds, labels))
        previous = step
    if not windows:
        raise ValueError(
            "no Marian update line ('Ep. E : Up. N : Sen. ... : Cost C * L after T : Time Ss : "
            "R words/s') in the training log; did the run fail or log with --disp-label-counts "
            "false?"
        )
    return windows


# ------------------------------------------------------------------------------ its recipe

RECIPE = {
    "source": "Marian's --task transformer-base-prenorm preset (the pre-norm Transformer of "
    "its examples: marian-examples transformer-intro and transformer/run-me.sh); there is no "
    "small-corpus example",
    "kept": "lr 3e-4 with an inverse-square-root decay, Adam 0.9/0.98/1e-9, no gradient "
    "clipping, dropout 0.1, label smoothing 0.1, ce-mean-words, exponential smoothing 1e-4, "
    "synchronous SGD; validation BLEU keeps the best model, which is decoded with beam 5 and "
    "normalize 1",
    "adapted": [
        "3+3 layers, width 256, 4 heads, FFN 1,024 (the preset: 6+6 of 512)",
        "warm-up and decay start at 100 updates (the preset: 16,000, which 30 minutes never reach)",
        "batches of about 3,500 target tokens (--mini-batch-words, the preset fits GPU memory) "
        "and a 2 GB workspace",
        "validation every 200 updates on the first 300 validation sentences, beam 5",
        "stopped by SIGTERM at the deadline (Marian saves and exits)",
    ],
}
STOP_SIGNAL = signal.SIGTERM


def recipe_options(job: RecipeJob, ws: Workspace, vocab: Path) -> dict[str, Any]:
    base = TrainJob("transformer", "32", 10**7, 3500, job.threads, job.work, 50, job.seed)
    opts = train_options(base, ws, vocab)
    for key in ("after-batches", "save-freq", "valid-freq", "cost-type", "clip-norm"):
        opts.pop(key)
    opts.update(
        {
            "task": "transformer-base-prenorm",
            "workspace": 2048,
            "learn-rate": 3e-4,
            "lr-warmup": "100u",
            "lr-decay-inv-sqrt": ["100u"],
            "clip-norm": 0,
            "cost-type": "ce-mean-words",
            "exponential-smoothing": 1e-4,
            "valid-sets": [str(ws.text("val300", ws.src)), str(ws.text("val300", ws.tgt))],
            "valid-freq": "200u",
            "save-freq": "200u",
            "valid-metrics": ["bleu", "ce-mean-words"],
            "beam-size": 5,
            "normalize": 1.0,
            "valid-mini-batch": 16,
            "keep-best": True,
            "early-stopping": 10,
            "quiet-translation": True,
        }
    )
    return opts


def recipe_command(python: Path, job: RecipeJob, ws: Workspace) -> Command:
    """Marian on the adapted preset, until the harness stops it."""
    return marian_train(python, job.work, job.threads, ws, recipe_options, job, "recipe.yml")


# Marian's own translator: CTranslate2 also converts Marian models, but its CPU decoding of
# Transformers is already timed on nmt's and Eole's conversions
ENGINES = (NATIVE,)


def decode_command(python: Path, job: RecipeJob, ws: Workspace, d: Decoding) -> Command:
    """``pymarian decode`` of ``d.src`` with the best-BLEU model (else the last) at ``d.beam``,
    normalize 1; sentencepiece decodes the output."""
    best = job.work / "model.npz.best-bleu.npz"
    model = best if best.exists() else job.work / "model.npz"
    vocab = str(job.work / "vocab.spm")
    return command(
        [
            str(python),
            "-m",
            "pymarian",
            "decode",
            "-m",
            str(model),
            "-v",
            vocab,
            vocab,
            "-i",
            str(d.src),
            "-o",
            str(d.out),
            "-b",
            str(d.beam),
            "-n",
            "1.0",
            "--cpu-threads",
            str(job.threads),
            "--mini-batch",
            "1" if d.one_at_a_time else "64",
            "--maxi-batch",
            "1" if d.one_at_a_time else "100",
            "--maxi-batch-sort",
            "src",
            "--max-length-factor",
            "3",
        ],
        job.work,
        "decode.log",
        job.threads,
    )

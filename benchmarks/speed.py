"""Training and decoding speed of the default models on real Multi30k batches: ``make bench``.

Measures, in one run on one device (CPU or CUDA):

* the machine: device name, torch version and threads, and the matrix-product peak in fp32
  and bf16 (large square products, median of several samples), against which model FLOPs
  utilisation is computed;
* training, per model and precision: a real optimizer step (``nmt.train.step.train_step``) on
  token batches of the training split (``TokenBatchSampler``, ``data.max_tokens``), timed per
  step after a warm-up; target and source+target tokens/s (non-pad), model FLOPs per target
  token (:mod:`benchmarks.flops`, padding excluded), achieved FLOP/s and its share of the measured
  peak, peak memory and padding share;
* decoding on the test split: greedy and beam search, batched and one sentence at a time, and
  for the Transformer greedy search without its incremental cache (the whole model re-run on
  the growing prefix at every step). Trained weights come from ``--ckpt-<model>`` or the
  newest run under ``outputs/runs``; without any, a randomly initialised model is decoded and
  marked ``"weights": "random"`` (its outputs run to the length cap, so speeds are low).

Writes a JSON file (default ``outputs/bench/bench-<timestamp>.json``) and prints tables
(``scripts/bench.py`` is the command line)::

    python scripts/bench.py                      # or: make bench
    python scripts/bench.py --quick              # about a minute: a smoke run, noisy figures
    python scripts/bench.py --models transformer --precision bf16 --device cuda
    python scripts/bench.py --models transformer --compile both      # eager and torch.compile
    python scripts/bench.py --set model.attn_dropout=0               # any config override

With ``--compile on|both`` each precision is also timed with the model compiled by
``torch.compile`` (what ``trainer.compile=true`` does); the untimed steps before the timed ones
then include the compilation and the recompilation for varying batch shapes, and their total
time is reported as ``warmup_seconds``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.tensorboard import SummaryWriter

from benchmarks.machine import MatmulSettings, busy_warning, load_average_or_none, machine_info
from benchmarks.report import SetupError, table
from benchmarks.report import say as _say
from benchmarks.timing import (
    DecodeSubject,
    StepSettings,
    WeightSource,
    compose_train_config,
    decode_subject,
    decode_with_search,
    decode_without_cache,
    output_caps,
    run_stats,
    time_training,
)
from nmt.cli import config_dir
from nmt.config import to_container
from nmt.data.batching import make_batch
from nmt.data.datasets import PreparedData, prepare_data
from nmt.decode.options import DecodeOptions
from nmt.environment import multi30k_source
from nmt.runtime.device import native_bf16, pick_device
from nmt.runtime.precision import resolve_precision
from nmt.store.loading import build_model
from nmt.viz.visualize import attend, log_validation_views, sentence_views

MODELS = ("transformer", "gru_bahdanau")
SCHEMA = "nmt-bench/1"
BEAM = 5
TEST_SET = "test_2016_flickr"
DEFINITIONS = {
    "tgt_tokens_per_s": "non-pad target tokens (target + EOS) per second of a training step, "
    "batch building included; median over the timed steps",
    "src_tgt_tokens_per_s": "non-pad source (with EOS) plus target tokens per second",
    "train_flops_per_tgt_token": "3 x forward matmul FLOPs (benchmarks.flops) for the unpadded "
    "lengths of each sentence, per target token; causal self-attention counted as the full T x T "
    "the model computes; embeddings, norms, softmax and loss not counted",
    "mfu": "achieved FLOP/s (median over steps) / matmul peak measured in this run in the "
    "training precision",
    "memory_growth_bytes": "CUDA: max_memory_allocated minus the level before the model was "
    "built; CPU: peak resident memory (high-water mark reset before the phase) minus resident "
    "memory before the model was built",
    "padding_share": "PAD share of all source and target positions of the timed batches",
    "decode.tgt_tokens": "tokens generated, EOS included",
    "decode.capped_share": "share of outputs that reached the length cap (a * source + b)",
    "decode.single": "max_tokens=1: every batch holds one sentence",
    "decode.no_cache": "greedy search re-running model.forward (encoder and decoder) over the "
    "whole prefix at every step; same_as_cached_greedy = share of identical outputs",
    "decode.attention_views": "seconds to draw the TensorBoard attention views that a validation "
    "draws (the first trainer.attention_sentences test sentences, one in --quick; "
    "trainer.attention_layers), greedy decode, pictures and PNG encoding included, into a scratch "
    "event file; median over VIEW_SAMPLES drawings, beside greedy_batched's seconds",
}
VIEW_SAMPLES = 3
SINGLE_SENTENCES = 250  # one-at-a-time decoding is slow on CPU: a subset keeps the run short


def say(msg: str) -> None:
    """Progress on stderr (the tables go to stdout)."""
    _say("bench", msg)


# ------------------------------------------------------------------------------ settings


@dataclass
class Settings:
    """What to measure and how long; built from the command line."""

    device: torch.device
    models: list[str]
    precisions: list[str]
    steps: int
    warmup: int
    decode_sentences: int
    single_sentences: int
    matmul_n: int
    matmul_samples: int
    matmul_seconds: float
    max_tokens: int
    data_root: Path
    runs_dir: Path
    checkpoints: dict[str, str | None]
    decode_precision: str
    out: Path
    quick: bool
    compile_modes: list[bool] = field(default_factory=lambda: [False])
    overrides: list[str] = field(default_factory=list)
    decode: bool = True


def precisions(choice: str, device: torch.device) -> list[str]:
    """The training precisions of ``--precision``: auto = both where bf16 is native."""
    if choice == "both":
        return ["32", "bf16"]
    if choice == "auto":
        return ["32", "bf16"] if native_bf16(device) else ["32"]
    return [choice]


COMPILE_MODES = {"off": [False], "on": [True], "both": [False, True]}


def make_settings(
    *,
    data_root: Path,
    device: str = "auto",
    models: str = ",".join(MODELS),
    precision: str = "auto",
    steps: int | None = None,
    warmup: int | None = None,
    sentences: int | None = None,
    single_sentences: int | None = None,
    decode_precision: str = "auto",
    max_tokens: int | None = None,
    ckpt_transformer: str | None = None,
    ckpt_gru: str | None = None,
    runs: str = "outputs/runs",
    out: str | None = None,
    compile: str = "off",
    overrides: list[str] | None = None,
    decode: bool = True,
    quick: bool = False,
) -> Settings:
    """Settings with the defaults that depend on ``quick`` and the device filled in;
    SetupError names a bad value."""
    dev = pick_device(device)
    sentences = sentences if sentences is not None else (100 if quick else 0)
    single = single_sentences
    if single is None:
        single = 30 if quick else min(sentences or SINGLE_SENTENCES, SINGLE_SENTENCES)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    s = Settings(
        device=dev,
        models=[m.strip() for m in models.split(",") if m.strip()],
        precisions=precisions(precision, dev),
        steps=steps if steps is not None else (3 if quick else 10),
        warmup=warmup if warmup is not None else (1 if quick else 3),
        decode_sentences=sentences,
        single_sentences=single,
        matmul_n=(1024 if quick else 2048) if dev.type == "cpu" else 8192,
        matmul_samples=3 if quick else 7,
        matmul_seconds=0.05 if quick else 0.2,
        max_tokens=max_tokens or 0,
        data_root=Path(data_root),
        runs_dir=Path(runs),
        checkpoints={"transformer": ckpt_transformer, "gru": ckpt_gru},
        decode_precision=decode_precision,
        out=Path(out or f"outputs/bench/bench-{stamp}.json"),
        quick=quick,
        compile_modes=COMPILE_MODES[compile],
        overrides=list(overrides or []),
        decode=decode,
    )
    if s.steps < 1 or s.warmup < 0:
        raise SetupError(f"--steps={s.steps} must be >= 1 and --warmup={s.warmup} >= 0")
    unknown = [m for m in s.models if not (Path(config_dir()) / "model" / f"{m}.yaml").is_file()]
    if unknown:
        raise SetupError(f"unknown model config(s): {', '.join(unknown)}")
    return s


def train_config(model: str, s: Settings) -> DictConfig:
    """The training config of ``model`` with the settings' data root, device and overrides."""
    return compose_train_config(model, s.data_root, s.device, s.max_tokens, s.overrides)


# ------------------------------------------------------------------------------ decoding


def decode_runs(model: str) -> list[tuple[str, int, bool, bool]]:
    """(name, beam, one sentence at a time, incremental cache) of each decoding run."""
    runs = [
        ("greedy_batched", 1, False, True),
        (f"beam{BEAM}_batched", BEAM, False, True),
        ("greedy_single", 1, True, True),
        (f"beam{BEAM}_single", BEAM, True, True),
    ]
    if model.startswith("transformer"):
        runs.append(("greedy_batched_no_cache", 1, False, False))
    return runs


def bench_decoding(model: str, cfg: DictConfig, data: PreparedData, s: Settings) -> dict[str, Any]:
    """Sentences/s and tokens/s of each decoding run on the test set."""
    source = WeightSource(s.checkpoints, s.runs_dir, s.data_root)
    subject = decode_subject(model, cfg, data, s.device, source, say)
    ds = subject.test.data
    n_all = len(ds) if s.decode_sentences <= 0 else min(s.decode_sentences, len(ds))
    n_single = n_all if s.single_sentences <= 0 else min(s.single_sentences, n_all)
    base = DecodeOptions(precision=s.decode_precision, max_tokens=cfg.data.eval_max_tokens)
    decode_with_search(subject, base, min(16, n_all), s.device)  # warm-up
    runs: dict[str, Any] = {}
    greedy_outputs: list[list[int]] | None = None
    for name, beam, single, cache in decode_runs(model):
        # max_tokens=1: every sentence is over budget, so each batch holds one sentence
        opts = replace(base, beam=beam, max_tokens=1 if single else base.max_tokens)
        n = n_single if single else n_all
        say(f"decoding {model}: {name} on {n} sentences")
        run = decode_with_search if cache else decode_without_cache
        outputs, seconds = run(subject, opts, n, s.device)
        stats = run_stats(outputs, output_caps(subject.model, ds, n, opts), seconds, opts)
        stats.update(batching="single" if single else "batched", cache=cache)
        if name == "greedy_batched":
            greedy_outputs = outputs
        if not cache and greedy_outputs is not None:
            same = sum(a == b for a, b in zip(outputs, greedy_outputs, strict=False))
            stats["same_as_cached_greedy"] = same / len(outputs)
        runs[name] = stats
    views = bench_views(subject, cfg, replace(base, beam=1), s)
    return {
        "weights": subject.weights,
        "checkpoint": subject.checkpoint,
        "checkpoint_step": subject.step,
        "model_config": subject.config,
        "test_set": subject.test.name,
        "sentences": n_all,
        "single_sentences": n_single,
        "precision": resolve_precision(s.decode_precision, s.device),
        "max_len_a": base.max_output_len_a,
        "max_len_b": base.max_output_len_b,
        "runs": runs,
        "attention_views": views,
    }


def bench_views(
    subject: DecodeSubject, cfg: DictConfig, opts: DecodeOptions, s: Settings
) -> dict[str, Any]:
    """What drawing a validation's attention views in TensorBoard costs (see DEFINITIONS)."""
    n = 1 if s.quick else min(int(cfg.trainer.attention_sentences), len(subject.test))
    layers = str(cfg.trainer.attention_layers)
    if n <= 0:
        return {"sentences": 0}
    batch = make_batch(subject.test.data, list(range(n))).to(s.device)
    drawn = attend(subject.model, batch.src, batch.src_lens, opts)
    pictures = sum(len(sentence_views(sent, subject.tokenizers, layers)) for sent in drawn)
    say(f"drawing the attention views of {n} sentences ({pictures} pictures)")
    samples = []
    with tempfile.TemporaryDirectory() as scratch:
        writer = SummaryWriter(scratch)
        try:
            for step in range(VIEW_SAMPLES):
                start = time.perf_counter()
                log_validation_views(
                    writer, subject.model, subject.test, subject.tokenizers, step, s.device, n,
                    layers, opts=opts,
                )  # fmt: skip
                samples.append(time.perf_counter() - start)
        finally:
            writer.close()
    return {
        "sentences": n,
        "layers": layers,
        "pictures": pictures,
        "seconds": statistics.median(samples),
        "samples": samples,
    }


# ------------------------------------------------------------------------------ one model


class DataCache:
    """Prepared data per data config (both default models share one)."""

    def __init__(self) -> None:
        self._data: dict[str, PreparedData] = {}

    def get(self, cfg: DictConfig) -> PreparedData:
        key = OmegaConf.to_yaml(cfg.data, resolve=True)
        if key not in self._data:
            say(f"preparing data {cfg.data.name}")
            self._data[key] = prepare_data(cfg.data, source=multi30k_source())
        return self._data[key]


def bench_model(
    model: str, data_cache: DataCache, s: Settings, machine: dict[str, Any]
) -> dict[str, Any]:
    """Training in each precision, then decoding, for one model config."""
    cfg = train_config(model, s)
    data = data_cache.get(cfg)
    params = build_model(cfg, data.tokenizers).num_parameters()
    result: dict[str, Any] = {
        "config": to_container(cfg.model),
        "parameters": params,
        "vocab": {"src": data.tokenizers.src.vocab_size, "tgt": data.tokenizers.tgt.vocab_size},
        "train": {},
    }
    for precision in s.precisions:
        peak = machine["matmul_peak"][precision]["tflops"]
        for compiled in s.compile_modes:
            key = precision + ("+compile" if compiled else "")
            say(f"training {model} in {key}: {s.warmup} + {s.steps} steps")
            steps = StepSettings(s.device, s.steps, s.warmup)
            result["train"][key] = time_training(cfg, data, precision, steps, peak, compiled)
    if s.decode:
        result["decode"] = bench_decoding(model, cfg, data, s)
    return result


# ------------------------------------------------------------------------------ report


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def training_table(result: dict[str, Any]) -> str:
    header = [
        "model", "prec", "step s", "tgt tok/s", "src+tgt tok/s", "GFLOP/tgt tok",
        "TFLOP/s", "peak TFLOP/s", "MFU", "mem GiB", "pad",
    ]  # fmt: skip
    rows = []
    for model, m in result["models"].items():
        for prec, t in m["train"].items():
            rows.append([
                model, prec, f"{t['step_seconds_median']:.3f}", f"{t['tgt_tokens_per_s']:.0f}",
                f"{t['src_tgt_tokens_per_s']:.0f}", f"{t['train_flops_per_tgt_token'] / 1e9:.3f}",
                f"{t['achieved_tflops']:.3f}", f"{t['peak_tflops']:.3f}", f"{100 * t['mfu']:.1f}%",
                _gib(t["memory_growth_bytes"]), f"{100 * t['padding_share']:.1f}%",
            ])  # fmt: skip
    return table(header, rows)


def decoding_table(result: dict[str, Any]) -> str:
    header = [
        "model",
        "weights",
        "run",
        "sents",
        "seconds",
        "sent/s",
        "tok/s",
        "tok/sent",
        "capped",
    ]
    rows = []
    for model, m in result["models"].items():
        d = m.get("decode")
        for name, r in d["runs"].items() if d else ():
            rows.append([
                model, d["weights"], name, str(r["sentences"]), f"{r['seconds']:.2f}",
                f"{r['sentences_per_s']:.1f}", f"{r['tgt_tokens_per_s']:.0f}",
                f"{r['mean_output_tokens']:.1f}", f"{100 * r['capped_share']:.0f}%",
            ])  # fmt: skip
    return table(header, rows)


def report(result: dict[str, Any]) -> str:
    """The printed summary: machine, training table, decoding table and caveats."""
    mach = result["machine"]
    peaks = ", ".join(f"{k} {v['tflops']:.3f}" for k, v in mach["matmul_peak"].items())
    lines = [
        f"device: {mach['device_name']} ({mach['device']}), torch {mach['torch']}, "
        f"{mach['torch_threads']} threads; matmul peak TFLOP/s: {peaks}",
    ]
    warning = busy_warning(mach)
    if warning:
        lines.append(warning)
    if result["quick"]:
        lines.append("QUICK RUN: few steps and sentences; the figures are noisy")
    lines += ["", "training (median over timed steps; FLOPs = 3 x forward matmuls, no padding)"]
    lines.append(training_table(result))
    for model, m in result["models"].items():
        for key, t in m["train"].items():
            if t.get("compiled"):
                lines.append(
                    f"{model} {key}: {t['warmup_steps']} untimed steps took "
                    f"{t['warmup_seconds']:.0f} s (compilation and recompilation included)"
                )
    decoded = {model: m["decode"] for model, m in result["models"].items() if "decode" in m}
    if not decoded:
        return "\n".join(lines)
    lines += ["", "decoding (tokens generated, EOS included)", decoding_table(result)]
    for model, d in decoded.items():
        source = f"{d['checkpoint']} (step {d['checkpoint_step']})" if d["checkpoint"] else "none"
        lines.append(f"{model}: {d['weights']} weights, checkpoint {source}, {d['test_set']}")
        views, greedy = d.get("attention_views", {}), d["runs"]["greedy_batched"]
        if views.get("sentences"):
            lines.append(
                f"{model}: the attention views of {views['sentences']} validation sentence(s) "
                f"({views['pictures']} pictures) drawn in {views['seconds']:.2f} s; greedy "
                f"decoding of {greedy['sentences']} sentences took {greedy['seconds']:.2f} s"
            )
    if any(d["weights"] == "random" for d in decoded.values()):
        lines.append(
            "weights=random: no trained checkpoint found, so a randomly initialised model was "
            "decoded; its outputs run to the length cap, so these speeds are pessimistic"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------ main


def run(s: Settings) -> dict[str, Any]:
    """Measure everything the settings ask for; returns the JSON-ready result."""
    start = time.perf_counter()
    matmul = MatmulSettings(s.matmul_n, s.matmul_samples, s.matmul_seconds)
    machine = machine_info(s.device, matmul, say)
    data_cache = DataCache()
    models = {m: bench_model(m, data_cache, s, machine) for m in s.models}
    settings = {
        "models": s.models,
        "precisions": s.precisions,
        "compile": s.compile_modes,
        "overrides": s.overrides,
        "steps": s.steps,
        "warmup": s.warmup,
        "decode_sentences": s.decode_sentences,
        "single_sentences": s.single_sentences,
        "decode_precision": s.decode_precision,
        "beam": BEAM,
    }
    return envelope(SCHEMA, s, settings, DEFINITIONS, machine, models, start)


def envelope(
    schema: str,
    s: Settings,
    settings: dict[str, Any],
    definitions: dict[str, str],
    machine: dict[str, Any],
    models: dict[str, Any],
    start: float,
) -> dict[str, Any]:
    """A result of ``scripts/bench.py`` (timing or profile): what was measured, how, on which
    machine (with its load average now), and the seconds since ``start``."""
    return {
        "schema": schema,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": s.quick,
        "settings": settings,
        "definitions": definitions,
        "machine": {**machine, "load_average_end": load_average_or_none()},
        "models": models,
        "seconds": time.perf_counter() - start,
    }

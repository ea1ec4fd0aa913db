"""Training and decoding speed of the default models on real Multi30k batches: ``make bench``.

Measures, in one run on one device (CPU or CUDA):

* the machine: device name, torch version and threads, and the matrix-product peak in fp32
  and bf16 (large square products, median of several samples), against which model FLOPs
  utilisation is computed;
* training, per model and precision: a real optimizer step (``nmt.train.train_step``) on
  token batches of the training split (``TokenBatchSampler``, ``data.max_tokens``), timed per
  step after a warm-up; target and source+target tokens/s (non-pad), model FLOPs per target
  token (:mod:`nmt.flops`, padding excluded), achieved FLOP/s and its share of the measured
  peak, peak memory and padding share;
* decoding on the test split: greedy and beam search, batched and one sentence at a time, and
  for the Transformer greedy search without its incremental cache (the whole model re-run on
  the growing prefix at every step). Trained weights come from ``--ckpt-<model>`` or the
  newest run under ``outputs/runs``; without any, a randomly initialised model is decoded and
  marked ``"weights": "random"`` (its outputs run to the length cap, so speeds are low).

Writes a JSON file (default ``outputs/bench/bench-<timestamp>.json``) and prints tables::

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

import argparse
import contextlib
import copy
import ctypes
import gc
import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from nmt.config import register_configs, to_container
from nmt.data.batching import TokenBatchSampler, TokenDataset, make_batch, padding_share
from nmt.data.prepare import EvalSet, PreparedData, load_test_sets, prepare_data
from nmt.data.tokenizer import BOS_ID, EOS_ID, Tokenizer
from nmt.flops import TRAIN_FACTOR, forward_flops_breakdown
from nmt.inference import build_model, load_trained
from nmt.models.base import Seq2Seq
from nmt.optim import build_optimizer, build_scheduler
from nmt.precision import resolve_precision
from nmt.runtime import (
    DistInfo,
    autocast,
    config_dir,
    cpu_model,
    device_name,
    native_bf16,
    pick_device,
)
from nmt.search import (
    DecodeOptions,
    decode_batches,
    decode_dataset,
    max_output_lengths,
    model_max_positions,
)
from nmt.train import train_step

REPO = Path(__file__).resolve().parents[1]
MODELS = ("transformer", "gru_bahdanau")
SCHEMA = "nmt-bench/1"
BEAM = 5
TEST_SET = "test_2016_flickr"
DEFINITIONS = {
    "tgt_tokens_per_s": "non-pad target tokens (target + EOS) per second of a training step, "
    "batch building included; median over the timed steps",
    "src_tgt_tokens_per_s": "non-pad source (with EOS) plus target tokens per second",
    "train_flops_per_tgt_token": "3 x forward matmul FLOPs (nmt.flops) for the unpadded lengths "
    "of each sentence, per target token; causal self-attention counted as the full T x T the "
    "model computes; embeddings, norms, softmax and loss not counted",
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
}
COMPILE_WARMUP = 3  # extra untimed steps for torch.compile: first shapes, then dynamic ones
SINGLE_SENTENCES = 250  # one-at-a-time decoding is slow on CPU: a subset keeps the run short


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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated model configs")
    p.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "32", "bf16", "both"],
        help="training precision(s); auto = both where the device has native bf16, else 32",
    )
    p.add_argument("--steps", type=int, help="timed training steps (default 10, quick 3)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default 3, quick 1)")
    p.add_argument("--sentences", type=int, help="test sentences decoded (default all; quick 100)")
    p.add_argument(
        "--single-sentences",
        type=int,
        help=f"sentences decoded one at a time (default {SINGLE_SENTENCES}; quick 30; 0 = all)",
    )
    p.add_argument(
        "--decode-precision",
        default="auto",
        choices=["auto", "32", "bf16"],
        help="autocast for decoding; auto = bf16 on CUDA, else 32",
    )
    p.add_argument("--max-tokens", type=int, help="training batch budget (default data.max_tokens)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--ckpt-transformer", help="checkpoint for decoding the Transformer")
    p.add_argument("--ckpt-gru", help="checkpoint for decoding the GRU model")
    p.add_argument("--runs", default="outputs/runs", help="where to look for trained runs")
    p.add_argument("--data-root", default=str(REPO / "data"), help="data.root for Multi30k")
    p.add_argument("--out", help="JSON output (default outputs/bench/bench-<timestamp>.json)")
    p.add_argument(
        "--compile",
        default="off",
        choices=["off", "on", "both"],
        help="time training with torch.compile (trainer.compile=true) too; default off",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a training config override for every model, e.g. model.attn_dropout=0 (repeatable)",
    )
    p.add_argument(
        "--decode",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure decoding too (--no-decode: training only)",
    )
    p.add_argument("--quick", action="store_true", help="few steps and sentences (~1 minute)")
    return p.parse_args(argv)


def _precisions(choice: str, device: torch.device) -> list[str]:
    if choice == "both":
        return ["32", "bf16"]
    if choice == "auto":
        return ["32", "bf16"] if native_bf16(device) else ["32"]
    return [choice]


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Defaults that depend on --quick and the device filled in."""
    device = pick_device(args.device)
    quick = bool(args.quick)
    sentences = args.sentences if args.sentences is not None else (100 if quick else 0)
    single = args.single_sentences
    if single is None:
        single = 30 if quick else min(sentences or SINGLE_SENTENCES, SINGLE_SENTENCES)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    return Settings(
        device=device,
        models=models,
        precisions=_precisions(args.precision, device),
        steps=args.steps if args.steps is not None else (3 if quick else 10),
        warmup=args.warmup if args.warmup is not None else (1 if quick else 3),
        decode_sentences=sentences,
        single_sentences=single,
        matmul_n=(1024 if quick else 2048) if device.type == "cpu" else 8192,
        matmul_samples=3 if quick else 7,
        matmul_seconds=0.05 if quick else 0.2,
        max_tokens=args.max_tokens or 0,
        data_root=Path(args.data_root),
        runs_dir=Path(args.runs),
        checkpoints={"transformer": args.ckpt_transformer, "gru": args.ckpt_gru},
        decode_precision=args.decode_precision,
        out=Path(args.out or f"outputs/bench/bench-{stamp}.json"),
        quick=quick,
        compile_modes={"off": [False], "on": [True], "both": [False, True]}[args.compile],
        overrides=list(args.set),
        decode=bool(args.decode),
    )


def say(msg: str) -> None:
    """Progress on stderr (the tables go to stdout)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ machine


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so that host timers measure it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    synchronize(device)
    tic = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - tic


def matmul_peak(
    device: torch.device, dtype: torch.dtype, n: int, samples: int, seconds: float
) -> dict[str, Any]:
    """Median TFLOP/s of ``n x n`` products; each sample repeats the product for ``seconds``."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)

    def product() -> None:
        torch.matmul(a, b, out=c)

    _timed(product, device)  # warm-up: kernel choice, caches
    repeats = max(1, math.ceil(seconds / max(_timed(product, device), 1e-6)))

    def sample() -> None:
        for _ in range(repeats):
            product()

    flops = 2.0 * n**3 * repeats
    tflops = [flops / _timed(sample, device) / 1e12 for _ in range(samples)]
    return {
        "n": n,
        "repeats_per_sample": repeats,
        "samples_tflops": [round(x, 4) for x in tflops],
        "tflops": statistics.median(tflops),
    }


def _load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat, or None."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def cpu_busy_share(seconds: float = 0.5) -> float | None:
    """Share of all CPUs busy over ``seconds`` while this process sleeps: others' load."""
    before = _cpu_times()
    time.sleep(seconds)
    after = _cpu_times()
    if before is None or after is None or after[1] == before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 3)


def busy_warning(machine: dict[str, Any]) -> str | None:
    """A warning when other work was running on the CPUs as the benchmark started."""
    busy = machine.get("cpu_busy_share_start")
    if busy is None or busy < 0.25:
        return None
    return (
        f"WARNING: {100 * busy:.0f}% of the CPUs were busy with other processes at the start, "
        "so these timings are unreliable (rerun on a quiet machine)"
    )


def machine_info(s: Settings) -> dict[str, Any]:
    """Device, software, and the measured matrix-product peaks."""
    info: dict[str, Any] = {
        "device": str(s.device),
        "device_name": device_name(s.device),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "python": platform.python_version(),
        "load_average_start": _load_average(),
        "cpu_busy_share_start": cpu_busy_share(),
        "native_bf16": native_bf16(s.device),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    if s.device.type == "cpu":
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    else:
        props = torch.cuda.get_device_properties(s.device)
        info["cuda"] = {
            "version": torch.version.cuda,
            "memory_bytes": props.total_memory,
            "multiprocessors": props.multi_processor_count,
            "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        }
    peak = {}
    for name, dtype in (("32", torch.float32), ("bf16", torch.bfloat16)):
        say(f"matmul peak {name} ({s.matmul_n} x {s.matmul_n})")
        peak[name] = matmul_peak(s.device, dtype, s.matmul_n, s.matmul_samples, s.matmul_seconds)
    info["matmul_peak"] = peak
    return info


# ------------------------------------------------------------------------------ memory


def _proc_status_kib(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def release_free_heap() -> None:
    """Hand freed heap pages back to the OS (glibc), so the next phase's RSS starts lower."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PeakMemory:
    """Peak memory of a phase: CUDA allocated bytes, or on CPU the growth of resident memory.

    On Linux the resident high-water mark is reset at :meth:`start` (``/proc/self/clear_refs``),
    so each phase gets its own peak; where that fails, the process-wide ``ru_maxrss`` is used
    (it never goes down, so later phases may read 0 growth).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.base = 0
        self.method = ""

    def start(self) -> None:
        gc.collect()
        release_free_heap()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            self.method = "cuda_max_memory_allocated"
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.base = (_proc_status_kib("VmRSS") or 0) * 1024
            self.method = "rss_high_water_growth"
        except OSError:
            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self.method = "ru_maxrss_growth"

    def read(self) -> dict[str, Any]:
        """{"peak_bytes": absolute peak, "growth_bytes": peak minus the level at start}."""
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
        elif self.method == "rss_high_water_growth":
            peak = (_proc_status_kib("VmHWM") or 0) * 1024
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"method": self.method, "peak_bytes": peak, "growth_bytes": max(peak - self.base, 0)}


# ------------------------------------------------------------------------------ configs, data


def compose_train_config(model: str, s: Settings) -> DictConfig:
    """The default training config for ``model=<model>``, as ``nmt-train`` composes it."""
    register_configs()
    overrides = [f"model={model}", f"data.root={s.data_root}", f"trainer.device={s.device}"]
    if s.max_tokens:
        overrides.append(f"data.max_tokens={s.max_tokens}")
    overrides += s.overrides
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def test_set(sets: list[EvalSet]) -> EvalSet:
    """test_2016_flickr when present, else the first test set."""
    return next((t for t in sets if t.name == TEST_SET), sets[0])


# ------------------------------------------------------------------------------ training


def batch_lengths(ds: TokenDataset, idx: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Source positions (EOS included) and decoder positions (BOS included) per sentence."""
    i = np.asarray(idx, dtype=np.int64)
    return ds.src_lens[i] + 1, ds.tgt_lens[i] + 1


def training_batches(cfg: DictConfig, data: PreparedData, count: int) -> list[list[int]]:
    """The first ``count`` batches of the first shuffled epoch (repeated if it is shorter)."""
    sampler = TokenBatchSampler(
        data.train.src_lens,
        data.train.tgt_lens,
        cfg.data.max_tokens,
        shuffle=True,
        seed=cfg.trainer.seed,
    )
    batches = sampler.batches(0)
    return [batches[i % len(batches)] for i in range(count)]


def _flop_stats(
    cfg: DictConfig, data: PreparedData, batches: list[list[int]]
) -> tuple[list[int], dict[str, int]]:
    """Training FLOPs of each batch, and the summed forward FLOPs by component."""
    vocab = data.tokenizers.tgt.vocab_size
    per_batch, parts = [], {}
    for idx in batches:
        src, tgt = batch_lengths(data.train, idx)
        breakdown = forward_flops_breakdown(cfg.model, src, tgt, vocab)
        per_batch.append(TRAIN_FACTOR * sum(breakdown.values()))
        for key, value in breakdown.items():
            parts[key] = parts.get(key, 0) + value
    return per_batch, parts


def time_training_steps(
    cfg: DictConfig,
    data: PreparedData,
    batches: list[list[int]],
    device: torch.device,
    compiled: bool = False,
) -> list[float]:
    """Seconds of each training step (batch building included) of a freshly built model.

    ``compiled``: the forward runs through ``torch.compile`` as with ``trainer.compile=true``.
    """
    torch.manual_seed(cfg.trainer.seed)
    model = build_model(cfg, data.tokenizers).to(device)
    model.train()
    step_model: torch.nn.Module = torch.compile(model) if compiled else model
    optimizer = build_optimizer(model, cfg.optim, fused=device.type == "cuda")
    scheduler = build_scheduler(optimizer, cfg.optim, cfg.trainer.max_steps)
    seconds = []
    for idx in batches:
        synchronize(device)
        tic = time.perf_counter()
        batch = make_batch(data.train, idx).to(device, non_blocking=True)
        train_step(step_model, [batch], optimizer, None, cfg, device, DistInfo())
        scheduler.step()
        synchronize(device)
        seconds.append(time.perf_counter() - tic)
    return seconds


def bench_training(
    cfg: DictConfig,
    data: PreparedData,
    precision: str,
    s: Settings,
    peak_tflops: float,
    compiled: bool = False,
) -> dict[str, Any]:
    """Throughput, FLOPs, utilisation and memory of training steps in ``precision``.

    ``compiled``: through ``torch.compile``, with COMPILE_WARMUP extra untimed steps (the
    first shapes compile, the next recompile with dynamic shapes).
    """
    cfg = copy.deepcopy(cfg)
    cfg.trainer.precision = precision
    warmup = s.warmup + (COMPILE_WARMUP if compiled else 0)
    batches = training_batches(cfg, data, warmup + s.steps)
    timed = batches[warmup:]
    memory = PeakMemory(s.device)
    memory.start()
    seconds = time_training_steps(cfg, data, batches, s.device, compiled)
    mem = memory.read()
    warmup_seconds = sum(seconds[:warmup])
    seconds = seconds[warmup:]
    flops, parts = _flop_stats(cfg, data, timed)
    lengths = [batch_lengths(data.train, idx) for idx in timed]
    tgt = [int(t.sum()) for _, t in lengths]
    both = [int(src.sum()) + int(t.sum()) for src, t in lengths]
    forward_total = sum(parts.values())
    achieved = statistics.median(f / t for f, t in zip(flops, seconds, strict=True))
    return {
        "precision": precision,
        "compiled": compiled,
        "warmup_steps": warmup,
        "warmup_seconds": warmup_seconds,
        "steps": len(seconds),
        "max_tokens": int(cfg.data.max_tokens),
        "step_seconds": [round(t, 5) for t in seconds],
        "step_seconds_median": statistics.median(seconds),
        "sentences_per_step_mean": statistics.mean(len(idx) for idx in timed),
        "tgt_tokens_per_step_mean": statistics.mean(tgt),
        "tgt_tokens_per_s": statistics.median(n / t for n, t in zip(tgt, seconds, strict=True)),
        "src_tgt_tokens_per_s": statistics.median(
            n / t for n, t in zip(both, seconds, strict=True)
        ),
        "tgt_tokens_per_s_overall": sum(tgt) / sum(seconds),
        "train_flops_per_tgt_token": sum(flops) / sum(tgt),
        "forward_flops_per_tgt_token": forward_total / sum(tgt),
        "forward_flops_share": {k: v / forward_total for k, v in parts.items()},
        "achieved_tflops": achieved / 1e12,
        "peak_tflops": peak_tflops,
        "mfu": achieved / 1e12 / peak_tflops,
        "peak_memory_bytes": mem["peak_bytes"],
        "memory_growth_bytes": mem["growth_bytes"],
        "memory_method": mem["method"],
        "padding_share": padding_share(data.train, timed),
    }


# ------------------------------------------------------------------------------ decoding


def find_checkpoint(model: str, runs_dir: Path) -> Path | None:
    """best.pt (else last.pt) of the newest run whose directory name contains ``model``."""
    if not runs_dir.is_dir():
        return None
    found = []
    for run in runs_dir.iterdir():
        if not run.is_dir() or model not in run.name:
            continue
        for name in ("best.pt", "last.pt"):
            path = run / "checkpoints" / name
            if path.is_file():
                found.append((path.stat().st_mtime, path))
                break
    return max(found)[1] if found else None


@dataclass
class DecodeSubject:
    """A model to decode with, its tokenizer and test set, and where its weights came from."""

    model: Seq2Seq
    tokenizer: Tokenizer
    test: EvalSet
    weights: str  # "trained" | "random"
    checkpoint: str | None
    step: int | None
    config: dict[str, Any]


def decode_subject(model: str, cfg: DictConfig, data: PreparedData, s: Settings) -> DecodeSubject:
    """The trained model from a checkpoint when there is one, else the random default model."""
    given = s.checkpoints["transformer" if model.startswith("transformer") else "gru"]
    path = Path(given) if given else find_checkpoint(model, s.runs_dir)
    if path is None:
        torch.manual_seed(cfg.trainer.seed)
        net = build_model(cfg, data.tokenizers).to(s.device).eval()
        test = test_set(load_test_sets(cfg.data, data.tokenizers))
        config = to_container(cfg.model)
        return DecodeSubject(net, data.tokenizers.tgt, test, "random", None, None, config)
    say(f"decoding {model} with {path}")
    trained = load_trained(path, s.device)
    data_cfg = copy.deepcopy(trained.cfg.data)
    if data_cfg.corpus == "multi30k":
        data_cfg.root = str(s.data_root)
    test = test_set(load_test_sets(data_cfg, trained.tokenizers))
    config = OmegaConf.to_container(trained.cfg.model, resolve=True)
    return DecodeSubject(
        trained.model, trained.tokenizers.tgt, test, "trained", str(path), trained.step, config
    )


def output_caps(model: Seq2Seq, ds: TokenDataset, n: int, opts: DecodeOptions) -> np.ndarray:
    """Each sentence's output cap (tokens before EOS), as the search computes it."""
    src_lens = torch.from_numpy(ds.src_lens[:n] + 1)  # (N,) EOS included
    caps = max_output_lengths(src_lens, opts.max_len_a, opts.max_len_b)  # (N,)
    limit = model_max_positions(model)
    if limit is not None:
        caps = caps.clamp(max=limit - 1)
    return caps.numpy()


def _run_stats(
    outputs: list[list[int]], caps: np.ndarray, seconds: float, opts: DecodeOptions
) -> dict[str, Any]:
    """Speed of a decoding run; tokens are the generated ones, EOS included."""
    tokens = sum(len(t) + 1 for t in outputs)
    capped = sum(len(t) >= int(c) for t, c in zip(outputs, caps, strict=True))
    return {
        "beam": opts.beam,
        "max_tokens": opts.max_tokens,
        "sentences": len(outputs),
        "seconds": seconds,
        "sentences_per_s": len(outputs) / seconds,
        "tgt_tokens": tokens,
        "tgt_tokens_per_s": tokens / seconds,
        "mean_output_tokens": tokens / max(len(outputs), 1),
        "capped_share": capped / max(len(outputs), 1),
    }


def detokenize(tokenizer: Tokenizer, outputs: list[list[int]]) -> list[str]:
    """The text of each output, as translate_dataset returns it (timed with the search)."""
    return [tokenizer.decode(tokens) for tokens in outputs]


def decode_with_search(
    subject: DecodeSubject, opts: DecodeOptions, n: int, device: torch.device
) -> tuple[list[list[int]], float]:
    """Outputs (token ids) of the library's search and its seconds, detokenization included."""
    ds = subject.test.data
    synchronize(device)
    tic = time.perf_counter()
    outputs = [h.tokens for h in decode_dataset(subject.model, ds, opts, device, n)]
    detokenize(subject.tokenizer, outputs)
    synchronize(device)
    return outputs, time.perf_counter() - tic


@torch.inference_mode()
def greedy_no_cache_batch(
    model: Seq2Seq, src: torch.Tensor, src_lens: torch.Tensor, caps: torch.Tensor
) -> list[list[int]]:
    """Greedy search that re-runs ``model.forward`` on the whole prefix at every step.

    The baseline for the incremental cache: the encoder and the decoder are recomputed over the
    full prefix each step. Finished rows leave the batch, as in ``greedy_search``.
    src: (B, S); src_lens, caps: (B,). Returns the tokens of each row (EOS excluded).
    """
    batch, device = src.size(0), src.device
    steps = int(caps.max()) + 1
    out = torch.full((batch, steps), EOS_ID, dtype=torch.long, device=device)  # (B, L)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)  # (B,)
    alive = torch.arange(batch, device=device)  # (A,)
    prefix = torch.full((batch, 1), BOS_ID, dtype=torch.long, device=device)  # (A, t)
    for step in range(steps):
        logits = model(src[alive], src_lens[alive], prefix)[:, -1]  # (A, V)
        best = logits.argmax(dim=-1).masked_fill(caps[alive] <= step, EOS_ID)  # (A,)
        out[alive, step] = best
        lengths[alive] = step + 1
        keep = (best != EOS_ID).nonzero().squeeze(1)  # (A',)
        if keep.numel() == 0:
            break
        alive, prefix = alive[keep], torch.cat([prefix[keep], best[keep, None]], dim=1)
    rows, lens = out.tolist(), lengths.tolist()
    return [row[: n - 1] for row, n in zip(rows, lens, strict=True)]


def decode_without_cache(
    subject: DecodeSubject, opts: DecodeOptions, n: int, device: torch.device
) -> tuple[list[list[int]], float]:
    """Greedy outputs without the incremental cache, in dataset order, and their seconds."""
    ds = subject.test.data
    caps_all = torch.from_numpy(output_caps(subject.model, ds, n, opts))  # (N,)
    outputs: list[list[int]] = [[] for _ in range(n)]
    nonempty = np.flatnonzero(ds.src_lens[:n] > 0)  # (M,)
    precision = resolve_precision(str(opts.precision), device)
    synchronize(device)
    tic = time.perf_counter()
    for batch_pos in decode_batches(ds.src_lens[nonempty], opts):
        idx = nonempty[batch_pos]  # (b,) dataset indices
        batch = make_batch(ds, idx).to(device)
        caps = caps_all[torch.from_numpy(idx)].to(device)  # (b,)
        with autocast(precision, device):
            rows = greedy_no_cache_batch(subject.model, batch.src, batch.src_lens, caps)
        for i, tokens in zip(idx.tolist(), rows, strict=True):
            outputs[i] = tokens
    detokenize(subject.tokenizer, outputs)
    synchronize(device)
    return outputs, time.perf_counter() - tic


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
    subject = decode_subject(model, cfg, data, s)
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
        stats = _run_stats(outputs, output_caps(subject.model, ds, n, opts), seconds, opts)
        stats.update(batching="single" if single else "batched", cache=cache)
        if name == "greedy_batched":
            greedy_outputs = outputs
        if not cache and greedy_outputs is not None:
            same = sum(a == b for a, b in zip(outputs, greedy_outputs, strict=False))
            stats["same_as_cached_greedy"] = same / len(outputs)
        runs[name] = stats
    return {
        "weights": subject.weights,
        "checkpoint": subject.checkpoint,
        "checkpoint_step": subject.step,
        "model_config": subject.config,
        "test_set": subject.test.name,
        "sentences": n_all,
        "single_sentences": n_single,
        "precision": resolve_precision(s.decode_precision, s.device),
        "max_len_a": base.max_len_a,
        "max_len_b": base.max_len_b,
        "runs": runs,
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
            self._data[key] = prepare_data(cfg.data)
        return self._data[key]


def bench_model(
    model: str, data_cache: DataCache, s: Settings, machine: dict[str, Any]
) -> dict[str, Any]:
    """Training in each precision, then decoding, for one model config."""
    cfg = compose_train_config(model, s)
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
            result["train"][key] = bench_training(cfg, data, precision, s, peak, compiled)
    if s.decode:
        result["decode"] = bench_decoding(model, cfg, data, s)
    return result


# ------------------------------------------------------------------------------ report


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    rule = "-+-".join("-" * w for w in widths)
    head = " | ".join(c.rjust(w) for c, w in zip(header, widths, strict=True))
    return "\n".join([head, rule, *lines])


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
    return _table(header, rows)


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
    return _table(header, rows)


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
    machine = machine_info(s)
    data_cache = DataCache()
    models = {m: bench_model(m, data_cache, s, machine) for m in s.models}
    return {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": s.quick,
        "settings": {
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
        },
        "definitions": DEFINITIONS,
        "machine": {**machine, "load_average_end": _load_average()},
        "models": models,
        "seconds": time.perf_counter() - start,
    }


def write_result(out: Path, result: dict[str, Any], text: str) -> None:
    """Write the JSON, then print the report and where the JSON went."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(text)
    print(f"\nwritten: {out}  ({result['seconds']:.0f} s)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    s = settings_from_args(args)
    if s.steps < 1 or s.warmup < 0:
        print(f"--steps={s.steps} must be >= 1 and --warmup={s.warmup} >= 0", file=sys.stderr)
        return 2
    unknown = [m for m in s.models if not (REPO / "configs" / "model" / f"{m}.yaml").is_file()]
    if unknown:
        print(f"unknown model config(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    result = run(s)
    write_result(s.out, result, report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Timed training steps and decoding runs, shared by the benchmarks.

Training: real optimizer steps (``nmt.train.step.train_step``) of a freshly built model on token
batches of the training split, timed one by one after a warm-up, with model FLOPs
(:mod:`benchmarks.flops`), peak memory and padding. Decoding: the library's search over a test set
(detokenization included) and, as the baseline of the incremental cache, a greedy search that
re-runs the whole model on the growing prefix at every step.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from benchmarks.flops import TRAIN_FACTOR, forward_flops_breakdown
from benchmarks.machine import synchronize
from benchmarks.memory import PeakMemory
from nmt.cli import config_dir
from nmt.config import register_configs, to_container
from nmt.data.batching import TokenBatchSampler, TokenDataset, make_batch, padding_share
from nmt.data.datasets import EvalSet, PreparedData, load_test_sets
from nmt.data.tokenizer import BOS_ID, EOS_ID, Tokenizer, TokenizerPair
from nmt.decode.options import DecodeOptions
from nmt.decode.search import decode_batches, decode_dataset
from nmt.environment import multi30k_source
from nmt.models.base import Seq2Seq
from nmt.runtime.device import autocast
from nmt.runtime.distributed import DistInfo
from nmt.runtime.precision import resolve_precision
from nmt.store.loading import build_model, load_trained
from nmt.train.optim import build_optimizer, build_scheduler
from nmt.train.step import train_step

TEST_SET = "test_2016_flickr"
COMPILE_WARMUP = 3  # extra untimed steps for torch.compile: first shapes, then dynamic ones


@dataclass
class StepSettings:
    """How training steps are timed: on which device, how many untimed steps first."""

    device: torch.device
    steps: int
    warmup: int


@dataclass
class WeightSource:
    """Where the weights to decode come from: a checkpoint given per model family
    ("transformer", "gru"), else the newest run under ``runs_dir``, else random weights;
    ``data_root`` is where a Multi30k checkpoint's test sets are read."""

    checkpoints: dict[str, str | None]
    runs_dir: Path
    data_root: Path


# ------------------------------------------------------------------------------ configs, data


def compose_train_config(
    model: str,
    data_root: Path,
    device: torch.device,
    max_tokens: int = 0,
    extra: Sequence[str] = (),
) -> DictConfig:
    """The default training config for ``model=<model>``, as ``nmt-train`` composes it;
    ``max_tokens`` (0: the config's) and the ``extra`` overrides change it."""
    register_configs()
    overrides = [f"model={model}", f"data.root={data_root}", f"trainer.device={device}"]
    if max_tokens:
        overrides.append(f"data.max_tokens={max_tokens}")
    overrides += list(extra)
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


def flop_stats(
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
    optimizer = build_optimizer(model, cfg.optim)
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


def time_training(
    cfg: DictConfig,
    data: PreparedData,
    precision: str,
    s: StepSettings,
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
    flops, parts = flop_stats(cfg, data, timed)
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
    """A model to decode with, its tokenizers and test set, and where its weights came from."""

    model: Seq2Seq
    tokenizers: TokenizerPair
    test: EvalSet
    weights: str  # "trained" | "random"
    checkpoint: str | None
    step: int | None
    config: dict[str, Any]


def decode_subject(
    model: str,
    cfg: DictConfig,
    data: PreparedData,
    device: torch.device,
    s: WeightSource,
    say: Callable[[str], None],
) -> DecodeSubject:
    """The trained model from a checkpoint when there is one, else the random default model."""
    given = s.checkpoints["transformer" if model.startswith("transformer") else "gru"]
    path = Path(given) if given else find_checkpoint(model, s.runs_dir)
    if path is None:
        torch.manual_seed(cfg.trainer.seed)
        net = build_model(cfg, data.tokenizers).to(device).eval()
        test = test_set(load_test_sets(cfg.data, data.tokenizers, multi30k_source()))
        config = to_container(cfg.model)
        return DecodeSubject(net, data.tokenizers, test, "random", None, None, config)
    say(f"decoding {model} with {path}")
    trained = load_trained(path, device)
    data_cfg = copy.deepcopy(trained.cfg.data)
    if data_cfg.corpus == "multi30k":
        data_cfg.root = str(s.data_root)
    test = test_set(load_test_sets(data_cfg, trained.tokenizers, multi30k_source()))
    config = OmegaConf.to_container(trained.cfg.model, resolve=True)
    return DecodeSubject(
        trained.model, trained.tokenizers, test, "trained", str(path), trained.step, config
    )


def output_caps(model: Seq2Seq, ds: TokenDataset, n: int, opts: DecodeOptions) -> np.ndarray:
    """Each sentence's output cap (tokens before EOS), as the search computes it."""
    return opts.caps(ds.src_lens[:n] + 1, model.max_positions)  # (N,) EOS included


def run_stats(
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
    detokenize(subject.tokenizers.tgt, outputs)
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
    detokenize(subject.tokenizers.tgt, outputs)
    synchronize(device)
    return outputs, time.perf_counter() - tic

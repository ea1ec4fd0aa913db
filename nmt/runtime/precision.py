"""Which autocast precision a run uses: ``precision=auto`` resolved, measured where it must be.

:func:`resolve_precision` is the one resolver, for training and for decoding:

* a precision given explicitly (``32``, ``bf16``, ``16``) is used as given;
* CUDA: bf16 on a GPU that computes it natively (compute capability 8.0 and later:
  :func:`nmt.runtime.device.native_bf16`), else fp16, which training runs with a loss scaler
  (the ``GradScaler`` that ``16`` gets). A V100 or T4 only emulates bf16, far slower than its
  fp16 tensor cores, though ``torch.cuda.is_bf16_supported()``, counting emulation by
  default, says yes there;
* a CPU without native bf16 (neither AVX512-BF16 nor AMX): fp32;
* a CPU with native bf16: training is measured (:class:`SpeedProbe`), because native bf16
  does not make every CPU faster in bf16. A 2-core AMD EPYC trained both default models
  1.3-1.5x faster under bf16 autocast than in fp32; a 2-core Xeon with AVX512-BF16 but no AMX
  multiplied matrices at about half its fp32 rate and trained them 1.4x slower.
* decoding passes no probe and gets fp32 on a CPU: a training-batch probe says little about
  incremental decoding (one target position per step), a decoding probe would delay every
  ``eval`` and ``translate``, and fp32 keeps a checkpoint's translations, and so its scores,
  the same whichever CPU decodes them;
* the validation decode during training is fp32 whatever training's precision, as
  ``nmt-eval`` decodes by default: :func:`validation_decode_precision`.

The measured choice is cached per machine, torch version and model/batch shape in a small
JSON file (``<data.root>/cache/precision/``, :mod:`nmt.runtime.measured`), so later runs start
without probing.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmt.config import DecodeConfig
from nmt.data.batching import Batch, TokenDataset, make_batch
from nmt.runtime.device import autocast, cpu_model, native_bf16
from nmt.runtime.measured import Choice, ChoiceCache

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "32", "bf16", "16")
CACHE_VERSION = 2  # 2: whole training batches (1: a quarter of one, or less)
BUDGET_SECONDS = 1.5  # timed pairs stop once the probe has taken this long ...
MIN_PAIRS, MAX_PAIRS = 3, 6  # ... but not before MIN_PAIRS, and never beyond MAX_PAIRS,
LIMIT_SECONDS = 5.0  # nor beyond this (after one pair) on a machine too busy to measure, or
LIMIT_STEPS = 20  # beyond this many untimed fp32 steps' time, where that is longer

StepFn = Callable[[str, int], int]  # (precision, sentences) -> target tokens of the step


@dataclass(frozen=True)
class Measurement:
    """Training speed in fp32 and under bf16 autocast, as a probe measured it."""

    fp32: float  # target tokens/s, median over the timed steps
    bf16: float
    seconds: float  # wall time of the whole probe
    rows: int  # sentences per probe batch
    pairs: int  # timed (fp32, bf16) pairs
    agree: bool  # every pair found the same precision faster

    @property
    def choice(self) -> str:
        """The faster precision; fp32 on a tie."""
        return "bf16" if self.bf16 > self.fp32 else "32"

    @property
    def trusted(self) -> bool:
        """Worth caching: enough pairs, all of one mind (else the machine was too busy)."""
        return self.pairs >= MIN_PAIRS and self.agree

    def describe(self) -> str:
        return f"fp32 {self.fp32:,.0f} vs bf16 {self.bf16:,.0f} target tokens/s"


@dataclass
class SpeedProbe:
    """How ``auto`` measures training speed on a CPU, and where it keeps the answer.

    ``measure`` runs the probe; ``shape`` is what its result depends on besides the machine
    and torch (model config, vocabulary sizes, batch shape): part of the cache key.
    ``cache_dir`` None: neither read nor write a cache.
    """

    measure: Callable[[], Measurement]
    shape: dict[str, Any]
    cache_dir: Path | None = None


def measure_speed(
    step: StepFn,
    max_rows: int,
    clock: Callable[[], float] = time.perf_counter,
    budget: float = BUDGET_SECONDS,
) -> Measurement:
    """Time ``step`` in fp32 and bf16, interleaved, on one batch shape; medians decide.

    The probe batch is a whole training batch (``max_rows`` sentences): a smaller one weighs
    what training batches amortise (casting the weights to bf16 once per step, per-call
    overheads) and picked fp32 where whole batches trained 1.4x faster in bf16 (the GRU on a
    2-core Xeon with AMX: fp32 about 1,900 and bf16 about 1,500 target tokens/s on a quarter
    batch, 2,300 and 3,200 on whole ones). Untimed steps come first (lazy initialisation,
    kernel selection, allocations); then pairs alternate their order so that a slow spell of
    a shared machine hits both precisions alike. The limit on a busy machine grows with the
    untimed fp32 step, so that a large model's probe still gets its MIN_PAIRS pairs.
    """
    start = clock()
    step("32", 1)  # first use: lazy initialisation, not timed
    rows = max(1, max_rows)
    tic = clock()
    step("32", rows)
    limit = max(LIMIT_SECONDS, LIMIT_STEPS * (clock() - tic))
    step("bf16", rows)
    times: dict[str, list[float]] = {"32": [], "bf16": []}
    tokens, pairs, faster = 1, 0, set()
    while pairs < MAX_PAIRS:
        pair = {}
        for precision in ("32", "bf16") if pairs % 2 == 0 else ("bf16", "32"):
            tic = clock()
            tokens = step(precision, rows)
            pair[precision] = max(clock() - tic, 1e-9)
            times[precision].append(pair[precision])
        faster.add(pair["bf16"] < pair["32"])
        pairs += 1
        elapsed = clock() - start
        if (pairs >= MIN_PAIRS and elapsed >= budget) or elapsed >= limit:
            break
    return Measurement(
        fp32=tokens / statistics.median(times["32"]),
        bf16=tokens / statistics.median(times["bf16"]),
        seconds=clock() - start,
        rows=rows,
        pairs=pairs,
        agree=len(faster) == 1,
    )


def synthetic_batch(
    rows: int, src_len: int, tgt_len: int, src_vocab: int, tgt_vocab: int, seed: int = 0
) -> Batch:
    """``rows`` sentence pairs of random non-special ids, every row ``src_len``/``tgt_len``."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, max(src_vocab, 5), (rows, src_len), generator=g).tolist()
    tgt = torch.randint(4, max(tgt_vocab, 5), (rows, tgt_len), generator=g).tolist()
    return make_batch(TokenDataset(src, tgt), np.arange(rows))


def model_step(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.nn.Module, Batch], torch.Tensor],
    lengths: tuple[int, int],
    vocab: tuple[int, int],
) -> StepFn:
    """A probe step: forward and backward of ``model`` on a synthetic batch (CPU).

    The optimizer step is left out: it runs on fp32 weights whatever the autocast dtype, so
    it adds the same time to both precisions and cannot change which one is faster.
    """
    batches: dict[int, Batch] = {}
    device = torch.device("cpu")

    def step(precision: str, rows: int) -> int:
        if rows not in batches:
            batches[rows] = synthetic_batch(rows, *lengths, *vocab)
        batch = batches[rows]
        model.zero_grad(set_to_none=True)
        with autocast(precision, device):
            loss = loss_fn(model, batch)
        loss.backward()
        return batch.n_tgt_tokens

    return step


def probe_model(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.nn.Module, Batch], torch.Tensor],
    max_tokens: int,
    lengths: tuple[int, int],
    vocab: tuple[int, int],
) -> Measurement:
    """Measure ``model``'s training speed in both precisions on batches shaped like training's.

    Why the model itself and not matrix products of its shapes: what decides is the whole
    step under autocast, with its casts, attention, recurrent cells, norms and loss, whose
    share of the time differs between models and CPUs, and which a matmul rate leaves out.
    ``lengths`` are typical source/target lengths (without EOS/BOS); a full batch holds
    ``max_tokens // (longest + 1)`` sentences. Weights, gradients (left None), train/eval mode
    and the random number generator are as before, so a probed run trains exactly like one
    that read its choice from the cache.
    """
    width = max(lengths) + 1
    step = model_step(model, loss_fn, lengths, vocab)
    was_training = model.training
    model.train()
    try:
        with torch.random.fork_rng(devices=[]):
            return measure_speed(step, max(1, max_tokens // width))
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)


# ------------------------------------------------------------------------------ the cache


def machine_key() -> dict[str, Any]:
    """What a measurement depends on besides the model: CPU, its bf16 units, threads, torch."""
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    avx512_bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
    return {
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "avx512_bf16": bool(avx512_bf16),
        "amx": bool(amx),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def _check_cached(choice: Choice) -> None:
    """Refuse a cached precision its own figures contradict, or figures not worth caching."""
    m = Measurement(**choice.figures)
    if choice.winner != m.choice or not (m.fp32 > 0 and m.bf16 > 0 and m.trusted):
        raise ValueError("its figures do not match its choice")


PRECISION_CACHE = ChoiceCache("precision", "measurement", ("32", "bf16"), _check_cached)


def _measure(probe: SpeedProbe) -> Choice:
    """Run ``probe`` and say what it found (and why it is not cached, where it is not)."""
    m = probe.measure()
    log.info(
        "precision=auto: %s on this CPU (measured in %.1fs, %d pairs of %d-sentence steps: %s)",
        m.choice, m.seconds, m.pairs, m.rows, m.describe(),
    )  # fmt: skip
    if not m.trusted:
        why = (
            "the timed pairs disagree on the faster precision (the two are close, or the "
            "machine is busy)"
            if m.pairs >= MIN_PAIRS
            else f"the probe was cut short after {m.seconds:.0f}s (a busy machine?)"
        )
        log.warning(
            "precision=auto: %s; not cached, the next run measures again "
            "(trainer.precision=32 or bf16 skips the probe)",
            why,
        )
    return Choice(m.choice, asdict(m), m.trusted)


def measured_choice(probe: SpeedProbe) -> str:
    """The faster precision for ``probe``: from the cache, else measured (and then cached)."""
    key = {"version": CACHE_VERSION, "machine": machine_key(), "shape": probe.shape}
    choice = PRECISION_CACHE.choose(probe.cache_dir, key, lambda: _measure(probe))
    if choice.source is not None:
        m = Measurement(**choice.figures)
        log.info(
            "precision=auto: %s on this CPU (cached in %s: %s)",
            choice.winner,
            choice.source,
            m.describe(),
        )
    return choice.winner


# ------------------------------------------------------------------------------ the resolver


def resolve_precision(precision: str, device: torch.device, probe: SpeedProbe | None = None) -> str:
    """``precision`` (auto | 32 | bf16 | 16) as the autocast dtype to use on ``device``.

    ``auto`` on a CPU with native bf16 is measured with ``probe`` (training); without one
    (decoding) it is fp32. See the module docstring for the rules and why.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of: {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if native_bf16(device) else "16"
    if device.type != "cpu" or probe is None or not native_bf16(device):
        return "32"
    return measured_choice(probe)


def validation_decode_precision(training: str) -> str:
    """The precision the validation decode asks for, whatever ``training`` is: the decoding
    commands' default (:class:`nmt.config.DecodeConfig`, fp32), so that validation BLEU is the
    greedy BLEU ``nmt-eval`` gives the checkpoint on any device. A validation in bf16 on a GPU
    would score what that GPU's rounding makes of the checkpoint, which ``nmt-eval`` on another
    device would not reproduce; on a CPU, bf16 incremental decoding would also make a new shape
    at every decoding step for oneDNN to build kernels for."""
    return DecodeConfig.precision

"""Speed of nmt next to JoeyNMT 2.3.0 on the same CPU: ``make bench-joeynmt``.

One invocation measures both toolkits, one after the other and never at the same time, with
the same number of threads (``--threads``, default 2; ``OMP_NUM_THREADS``/``MKL_NUM_THREADS``
for JoeyNMT, ``torch.set_num_threads`` for nmt):

* training throughput, target tokens/s (EOS included, padding excluded), median over steps after
  a warm-up, for the Transformer 3+3 (d256, 4 heads, ff1024, tied) and the biGRU + Bahdanau
  model (emb 256, hidden 512), nmt in fp32 and bf16. JoeyNMT runs its own configs
  (``transformer.yaml``: 4096-token batches with padding; ``rnn.yaml``: 64 sentences) for a
  fixed number of updates, logging every step; its per-step "Tokens per Sec" lines are parsed
  and its first logging window (and ``--joey-warmup`` steps) left out. nmt's token budget
  (``data.max_tokens``) is chosen so that its mean target tokens per step equal the ones JoeyNMT
  measured in the first round (``--max-tokens-transformer/--max-tokens-gru`` fix it instead).
  The toolkits alternate (JoeyNMT, nmt, JoeyNMT, nmt, ...) for ``--rounds`` rounds, so that a
  drift in the machine's speed hits both.
* decoding speed on test_2016_flickr (first ``--sentences``): greedy and beam 5, sentences/s and
  decoder steps/s, with the same cap of ``--max-output-length`` decoder steps per sentence for
  both (JoeyNMT's ``max_output_length``; nmt: ``max_output_len_a=0``,
  ``max_output_len_b=cap - 1`` tokens plus EOS). Output lengths and the share of outputs that
  hit the cap are recorded, since a model whose outputs run to the cap does far more work per
  sentence; ``--fixed-length`` blocks
  EOS in both toolkits, so that every output runs to the cap and the work is equal whatever
  the weights. JoeyNMT decodes
  ``--joey-ckpt-transformer/--joey-ckpt-rnn`` when given, else the weights of its short
  benchmark training (marked ``untrained``); nmt decodes ``--ckpt-transformer/--ckpt-gru``, else
  the newest run under ``outputs/runs``, else random weights.

JoeyNMT runs from its own virtual environment (``--joey-python``, installed by hand: README,
"Speed next to JoeyNMT") in a working folder (``--joey-dir``) with the configs of
``scripts/joeynmt`` (``--joey-configs``). What that folder lacks is made first: the plain-text
Multi30k files of ``data/`` (train, val, val300 = the first 300 lines of val, test_2016_flickr;
de and en), written from the verified corpus that ``make train`` uses (``--data-root``, fetched
there if missing), and the joint sentencepiece model ``spm/spm_joint8k.model`` + ``.vocab``
trained on train.de + train.en with the options of JoeyNMT's own recipe::

    python scripts/bench_joeynmt.py --joey-python ../joeyvenv/bin/python --joey-dir ../joeywork
    python scripts/bench_joeynmt.py ... --quick      # a smoke run: a few steps, 50 sentences

Writes ``outputs/bench/joeynmt-vs-nmt-<timestamp>.json`` and prints tables with ratios
nmt / JoeyNMT. JoeyNMT's files go to ``<joey-dir>/nmt_bench/`` (replaced at every run).

This module runs the comparison: nmt's side (its token budget, training and decoding) and the
rounds that alternate the toolkits. :mod:`benchmarks.joeynmt_setup` holds the settings, the
checks and the making of JoeyNMT's folder, :mod:`benchmarks.joeynmt_run` runs JoeyNMT and reads
its logs, :mod:`benchmarks.joeynmt_report` prints the tables.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from benchmarks.joeynmt_run import (
    JoeyTokenizer,
    checkpoint_stats,
    decode_stats,
    joey_config,
    joey_decode,
    joey_train,
)
from benchmarks.joeynmt_setup import (
    CPU,
    Settings,
    check_joey_python,
    check_settings,
    joey_files_missing,
    prepare_joey_dir,
    say,
)
from benchmarks.machine import cpu_busy_share, load_average_or_none
from benchmarks.report import SetupError
from benchmarks.timing import (
    DecodeSubject,
    compose_train_config,
    decode_subject,
    decode_with_search,
    time_training,
    training_batches,
)
from nmt.data.batching import TokenBatchSampler
from nmt.data.corpus import DataError
from nmt.data.datasets import PreparedData, prepare_data
from nmt.decode.options import DecodeOptions
from nmt.environment import multi30k_source
from nmt.runtime.device import cpu_model, native_bf16
from nmt.store.loading import build_model

SCHEMA = "nmt-vs-joeynmt/1"
BEAM = 5
# (our model config, JoeyNMT config file stem, label)
PAIRS = (("transformer", "transformer", "transformer"), ("gru_bahdanau", "rnn", "gru"))
DEFINITIONS = {
    "tgt_tokens_per_s": "non-pad target tokens (target + EOS) per second of a training step, "
    "median over the timed steps of all rounds (JoeyNMT: its 'Tokens per Sec' log lines, one "
    "per logging window, first window and warm-up steps left out)",
    "tgt_tokens_per_step_mean": "mean target tokens (with EOS) per update; JoeyNMT: total_tokens "
    "/ steps of its checkpoint (all steps of the segment)",
    "sentences_per_step_mean": "nmt: counted; JoeyNMT: its batch size for sentence batches, else "
    "tgt_tokens_per_step_mean / mean target tokens per training sentence (estimated)",
    "sentences_per_s": "sentences_per_step_mean / step_seconds_median",
    "step_seconds_median": "JoeyNMT: from the log timestamps of consecutive logging windows "
    "(divided by logging_freq)",
    "decode.seconds": "JoeyNMT: its 'Generation took' (the decoding loop); nmt: the search and "
    "detokenization, model loading excluded for both",
    "decode.decoder_steps": "decoder steps, EOS included: min(output tokens + 1, cap); JoeyNMT's "
    "output tokens are its detokenized outputs encoded again with its sentencepiece model",
    "decode.capped_share": "share of outputs that used all cap decoder steps",
}


# ------------------------------------------------------------------------------ nmt runs


def batch_means(data: PreparedData, max_tokens: int, seed: int) -> tuple[float, float]:
    """Mean target tokens (with EOS) and sentences per batch over a whole epoch."""
    sampler = TokenBatchSampler(data.train.src_lens, data.train.tgt_lens, max_tokens, seed=seed)
    n_batches = len(sampler.batches(0))
    tokens = int(data.train.tgt_lens.sum()) + len(data.train)
    return tokens / n_batches, len(data.train) / n_batches


def match_max_tokens(data: PreparedData, target: float, seed: int) -> dict[str, Any]:
    """The ``data.max_tokens`` whose batches hold ``target`` target tokens on average."""
    lo = int(np.max(np.maximum(data.train.src_lens, data.train.tgt_lens))) + 1
    hi = max(lo, 1 << 17)
    while lo < hi:  # smallest budget reaching the target
        mid = (lo + hi) // 2
        if batch_means(data, mid, seed)[0] >= target:
            hi = mid
        else:
            lo = mid + 1
    best = min((lo - 1, lo), key=lambda m: abs(batch_means(data, max(m, 1), seed)[0] - target))
    tokens, sentences = batch_means(data, best, seed)
    return {
        "max_tokens": best,
        "target_tgt_tokens_per_step": target,
        "epoch_tgt_tokens_per_step": tokens,
        "epoch_sentences_per_step": sentences,
    }


def nmt_train(
    model: str, cfg: DictConfig, data: PreparedData, precision: str, s: Settings
) -> dict[str, Any]:
    """One nmt training segment (the speed benchmark's timing) in ``precision``."""
    say(f"nmt {model}: training {s.warmup} + {s.steps} steps in {precision}")
    result = time_training(cfg, data, precision, s.nmt_steps, 1.0)
    for key in ("mfu", "peak_tflops", "forward_flops_share"):
        result.pop(key, None)
    batches = training_batches(cfg, data, s.warmup + s.steps)[s.warmup :]
    tokens = [int(data.train.tgt_lens[b].sum()) + len(b) for b in batches]
    result["step_tgt_tokens"] = tokens
    result["step_tokens_per_s"] = [
        n / t for n, t in zip(tokens, result["step_seconds"], strict=True)
    ]
    return result


def nmt_decode(
    model: str, subject: DecodeSubject, cfg: DictConfig, beam: int, s: Settings
) -> dict[str, Any]:
    opts = DecodeOptions(
        beam=beam,
        length_penalty=1.0,
        max_output_len_a=0.0,
        max_output_len_b=s.max_output_length - 1,
        min_output_len=s.max_output_length - 1 if s.fixed_length else 0,
        max_tokens=int(cfg.data.eval_max_tokens),
        precision="32",
    )
    n = min(s.sentences, len(subject.test.data))
    say(f"nmt {model}: decoding {n} sentences, beam {beam}")
    outputs, seconds = decode_with_search(subject, opts, n, CPU)
    stats = decode_stats([len(t) for t in outputs], seconds, s.max_output_length)
    stats["batch"] = f"{opts.max_tokens} tokens"
    return stats


# ------------------------------------------------------------------------------ the comparison


def summarize_joey(segments: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r for seg in segments for r in seg["window_tokens_per_s"]]
    seconds = [t for seg in segments for t in seg["step_seconds"]]
    per_step = statistics.mean(seg["tgt_tokens_per_step_mean"] for seg in segments)
    sentences = statistics.mean(seg["sentences_per_step_mean"] for seg in segments)
    return {
        "tgt_tokens_per_s": statistics.median(rates),
        "tgt_tokens_per_s_by_round": [seg["tgt_tokens_per_s"] for seg in segments],
        "step_seconds_median": statistics.median(seconds),
        "tgt_tokens_per_step_mean": per_step,
        "sentences_per_step_mean": sentences,
        "sentences_per_step_source": segments[0]["sentences_per_step_source"],
        "sentences_per_s": sentences / statistics.median(seconds),
        "peak_rss_bytes": max(seg["peak_rss_bytes"] for seg in segments),
        "rounds": segments,
    }


def summarize_nmt(segments: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r for seg in segments for r in seg["step_tokens_per_s"]]
    seconds = [t for seg in segments for t in seg["step_seconds"]]
    tokens = [n for seg in segments for n in seg["step_tgt_tokens"]]
    sentences = statistics.mean(seg["sentences_per_step_mean"] for seg in segments)
    return {
        "tgt_tokens_per_s": statistics.median(rates),
        "tgt_tokens_per_s_by_round": [seg["tgt_tokens_per_s"] for seg in segments],
        "step_seconds_median": statistics.median(seconds),
        "tgt_tokens_per_step_mean": statistics.mean(tokens),
        "sentences_per_step_mean": sentences,
        "sentences_per_step_source": "counted",
        "sentences_per_s": sentences / statistics.median(seconds),
        "peak_rss_bytes": max(seg["peak_memory_bytes"] for seg in segments),
        "rounds": segments,
    }


def joey_tokens_per_sentence(s: Settings, tokenizer: JoeyTokenizer) -> float:
    cfg = joey_config(s, "transformer")
    trg = cfg["data"]["trg"]["lang"]
    lines = (s.joey_dir / f"{cfg['data']['train']}.{trg}").read_text(encoding="utf-8").splitlines()
    counts = tokenizer.count(lines)
    return sum(counts) / len(counts) + 1  # + EOS


def nmt_config(
    model: str, data: PreparedData, target: float, s: Settings
) -> tuple[DictConfig, dict[str, Any]]:
    """nmt's training config for ``model`` with its token budget, and how it was chosen."""
    cfg = compose_train_config(model, s.data_root, CPU)
    seed = int(cfg.trainer.seed)
    given = s.max_tokens[model]
    if given:
        info: dict[str, Any] = {"max_tokens": given, "how": "given"}
    else:
        info = match_max_tokens(data, target, seed)
        info["how"] = "matched to JoeyNMT's target tokens per step in round 1"
    tokens, sentences = batch_means(data, info["max_tokens"], seed)
    info.update(epoch_tgt_tokens_per_step=tokens, epoch_sentences_per_step=sentences)
    cfg = compose_train_config(model, s.data_root, CPU, info["max_tokens"])
    return cfg, {"max_tokens": info}


def compare_training(
    s: Settings, data: PreparedData, tokenizer: JoeyTokenizer, joey_tps: float
) -> dict[str, Any]:
    """ABAB: per round, JoeyNMT then nmt for each model pair."""
    out: dict[str, Any] = {}
    joey: dict[str, list[dict[str, Any]]] = {stem: [] for _, stem, _ in PAIRS}
    ours: dict[str, dict[str, list[dict[str, Any]]]] = {
        model: {p: [] for p in s.precisions} for model, _, _ in PAIRS
    }
    cfgs: dict[str, DictConfig] = {}
    for r in range(s.rounds):
        say(f"training round {r + 1} of {s.rounds}")
        for model, stem, label in PAIRS:
            joey[stem].append(joey_train(s, stem, s.joey_steps[stem], joey_tps))
            if model not in cfgs:
                target = joey[stem][0]["tgt_tokens_per_step_mean"]
                cfgs[model], out[label] = nmt_config(model, data, target, s)
                say(f"nmt {model}: data.max_tokens={cfgs[model].data.max_tokens}")
            order = s.precisions if r % 2 == 0 else s.precisions[::-1]
            for precision in order:
                ours[model][precision].append(nmt_train(model, cfgs[model], data, precision, s))
    for model, stem, label in PAIRS:
        out[label]["joeynmt"] = summarize_joey(joey[stem])
        out[label]["joeynmt_parameters"] = joey[stem][0]["parameters"]
        out[label]["nmt"] = {p: summarize_nmt(ours[model][p]) for p in s.precisions}
        out[label]["nmt_parameters"] = build_model(cfgs[model], data.tokenizers).num_parameters()
    return out


def joey_decode_checkpoint(s: Settings, stem: str) -> tuple[Path | None, str]:
    given = s.joey_ckpts[stem]
    if given is not None:
        return given, "trained"
    own = s.work / f"train_{stem}" / "latest.ckpt"
    if own.exists():
        return own, "untrained"
    return None, "none"


def compare_decoding(s: Settings, data: PreparedData, tokenizer: JoeyTokenizer) -> dict[str, Any]:
    """Per model pair: JoeyNMT greedy, nmt greedy, JoeyNMT beam, nmt beam."""
    out: dict[str, Any] = {}
    for model, stem, label in PAIRS:
        ckpt, weights = joey_decode_checkpoint(s, stem)
        if ckpt is None:
            say(f"JoeyNMT {stem}: no checkpoint to decode (train first or --joey-ckpt-{stem})")
            continue
        stats = checkpoint_stats(ckpt)
        cfg = compose_train_config(model, s.data_root, CPU)
        subject = decode_subject(model, cfg, data, CPU, s.weights, say)
        warm = DecodeOptions(
            max_output_len_a=0.0, max_output_len_b=s.max_output_length - 1, precision="32"
        )
        decode_with_search(subject, warm, min(16, len(subject.test.data)), CPU)
        entry: dict[str, Any] = {
            "joeynmt": {
                "checkpoint": str(ckpt),
                "weights": weights,
                "checkpoint_steps": stats.get("steps"),
                "runs": {},
            },
            "nmt": {
                "checkpoint": subject.checkpoint,
                "weights": subject.weights,
                "checkpoint_steps": subject.step,
                "runs": {},
            },
        }
        for beam in (1, BEAM):
            run = "greedy" if beam == 1 else f"beam{beam}"
            entry["joeynmt"]["runs"][run] = joey_decode(s, stem, ckpt, beam, tokenizer)
            entry["nmt"]["runs"][run] = nmt_decode(model, subject, cfg, beam, s)
        out[label] = entry
        del subject
    return out


def machine(s: Settings) -> dict[str, Any]:
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": s.threads,
        "nmt_torch": torch.__version__,
        "nmt_torch_threads": torch.get_num_threads(),
        "native_bf16": native_bf16(torch.device("cpu")),
        "nice": os.nice(0),
        "load_average_start": load_average_or_none(),
        "cpu_busy_share_start": cpu_busy_share(),
    }


def run(s: Settings, joey: dict[str, Any]) -> dict[str, Any]:
    """Both comparisons in a prepared JoeyNMT folder; ``joey``: its venv's versions."""
    start = time.perf_counter()
    torch.set_num_threads(s.threads)
    if s.work.exists():
        shutil.rmtree(s.work)
    s.work.mkdir(parents=True)
    info = machine(s)
    info["joeynmt"] = joey
    say(f"JoeyNMT {info['joeynmt']['joeynmt']} with torch {info['joeynmt']['torch']}")
    cfg = compose_train_config("transformer", s.data_root, CPU)
    say("preparing nmt data")
    data = prepare_data(cfg.data, source=multi30k_source())
    tokenizer = JoeyTokenizer(s, joey_config(s, "transformer"))
    joey_tps = joey_tokens_per_sentence(s, tokenizer)
    ours_tps = float(data.train.tgt_lens.mean()) + 1
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": s.quick,
        "settings": {
            "threads": s.threads,
            "rounds": s.rounds,
            "nmt_steps": s.steps,
            "nmt_warmup": s.warmup,
            "joey_steps": s.joey_steps,
            "joey_warmup": s.joey_warmup,
            "joey_logging_freq": s.joey_logging_freq,
            "precisions": s.precisions,
            "sentences": s.sentences,
            "max_output_length": s.max_output_length,
            "fixed_length": s.fixed_length,
            "beam": BEAM,
            "length_penalty": 1.0,
            "joey_dir": str(s.joey_dir),
            "joey_configs": str(s.joey_configs),
            "nmt_weights": s.nmt_weights,
        },
        "definitions": DEFINITIONS,
        "machine": info,
        "tokenizers": {
            "joeynmt_tgt_tokens_per_train_sentence": joey_tps,
            "nmt_tgt_tokens_per_train_sentence": ours_tps,
            "joeynmt_spm": str(tokenizer.path),
        },
    }
    if s.train:
        result["train"] = compare_training(s, data, tokenizer, joey_tps)
    if s.decode:
        result["decode"] = compare_decoding(s, data, tokenizer)
    result["machine"]["load_average_end"] = load_average_or_none()
    result["seconds"] = time.perf_counter() - start
    return result


def compare(s: Settings) -> dict[str, Any]:
    """Check the settings and JoeyNMT's venv, make what its folder lacks, then run both
    comparisons; SetupError says what stops the run before anything is measured."""
    problems = check_settings(s)
    if problems:
        raise SetupError("\n".join(problems))
    s.joey_dir.mkdir(parents=True, exist_ok=True)
    joey, problems = check_joey_python(s)
    if problems:
        raise SetupError("\n".join(problems))
    try:
        prepare_joey_dir(s.joey_dir, s.data_root, s.threads)
    except DataError as err:
        raise SetupError(f"preparing JoeyNMT's folder {s.joey_dir}: {err}") from err
    problems = joey_files_missing(s.joey_dir, s.joey_configs)
    if problems:
        raise SetupError("\n".join(problems))
    return run(s, joey)

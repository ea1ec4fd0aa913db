"""Runs of JoeyNMT for the comparison (:mod:`benchmarks.joeynmt`): its training and decoding
processes, timed, and what is read from their logs and checkpoints.

:func:`joey_train` runs one training segment and parses its per-step "Tokens per Sec" lines
(:func:`parse_train_log`); :func:`joey_decode` decodes the test subset with one checkpoint and
beam size. :func:`decode_stats` turns output lengths and seconds into the decoding figures of
both toolkits.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch
import yaml

from benchmarks.joeynmt_setup import Settings, say
from benchmarks.peers_common import command, run


@dataclass
class Process:
    rc: int
    seconds: float
    peak_rss_bytes: int
    started: float  # time.time() at start
    log: Path


def run_joey(s: Settings, args: list[str], log: Path) -> Process:
    """``<joey-python> -m joeynmt ARGS`` in the JoeyNMT folder; output into ``log``."""
    cmd = command([str(s.joey_python), "-m", "joeynmt", *args], s.joey_dir, log, s.threads)
    started = time.time()
    done = run(cmd, s.joey_timeout)
    if done.rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise RuntimeError(f"JoeyNMT failed (rc {done.rc}): {' '.join(cmd.argv)}\n{tail}")
    return Process(done.rc, done.seconds, done.peak_rss_bytes, started, log)


def joey_config(s: Settings, stem: str) -> dict[str, Any]:
    return yaml.safe_load((s.joey_configs / f"{stem}.yaml").read_text())


def write_yaml(path: Path, cfg: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


LOG_TIME = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
STEP_LINE = re.compile(LOG_TIME + r".*Step:\s+(\d+), .*Tokens per Sec:\s+([\d.]+)")
EPOCH_LINE = re.compile(LOG_TIME + r".*joeynmt\.training - EPOCH 1\b")
GEN_LINE = re.compile(r"Generation took ([\d.]+)\[sec\]")


def _log_time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def parse_train_log(text: str, logging_freq: int, skip: int) -> dict[str, Any]:
    """Per-window throughput of a JoeyNMT training log, windows ending after ``skip`` steps."""
    start = None
    windows = []  # (step, seconds since the previous log line, tokens/s)
    previous = None
    for line in text.splitlines():
        m = EPOCH_LINE.match(line)
        if m and start is None:
            start = previous = _log_time(m.group(1))
            continue
        m = STEP_LINE.match(line)
        if m and previous is not None:
            t = _log_time(m.group(1))
            windows.append((int(m.group(2)), t - previous, float(m.group(3))))
            previous = t
    if start is None or not windows:
        raise RuntimeError("no 'EPOCH 1' or 'Step: ... Tokens per Sec' lines in the JoeyNMT log")
    timed = [w for w in windows if w[0] - logging_freq >= skip]
    if not timed:
        raise RuntimeError(f"JoeyNMT logged no window after its first {skip} steps")
    seconds = [dt / logging_freq for _, dt, _ in timed]
    tokens = sum(dt * rate for _, dt, rate in timed)
    return {
        "first_log_time": start,
        "logged_windows": len(windows),
        "timed_windows": len(timed),
        "timed_steps": len(timed) * logging_freq,
        "window_tokens_per_s": [rate for _, _, rate in timed],
        "step_seconds": [round(x, 4) for x in seconds],
        "step_seconds_median": statistics.median(seconds),
        "tgt_tokens_per_s": statistics.median(rate for _, _, rate in timed),
        "tgt_tokens_per_s_overall": tokens / sum(dt for _, dt, _ in timed),
        "timed_tgt_tokens_per_step_estimate": tokens / (len(timed) * logging_freq),
    }


def checkpoint_stats(path: Path) -> dict[str, Any]:
    """JoeyNMT's training statistics stored in a checkpoint (steps, total_tokens, ...)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    return dict(state.get("stats_state", {}))


class JoeyTokenizer:
    """JoeyNMT's target sentencepiece model, to count the tokens of its inputs and outputs."""

    def __init__(self, s: Settings, cfg: dict[str, Any]) -> None:
        model = cfg["data"]["trg"]["tokenizer_cfg"]["model_file"]
        self.path = (s.joey_dir / model).resolve()
        self.sp = spm.SentencePieceProcessor(model_file=str(self.path))

    def count(self, lines: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self.sp.encode(list(lines))]


def joey_train(s: Settings, stem: str, steps: int, tokens_per_sentence: float) -> dict[str, Any]:
    """One JoeyNMT training segment of ``steps`` updates, without validation."""
    cfg = joey_config(s, stem)
    model_dir = s.work / f"train_{stem}"
    cfg["model_dir"] = str(model_dir)
    cfg["use_cuda"] = False
    cfg["fp16"] = False
    train = cfg["training"]
    train.update(
        updates=steps,
        logging_freq=s.joey_logging_freq,
        validation_freq=10 * steps + 10**6,
        overwrite=True,
    )
    path = write_yaml(s.work / f"train_{stem}.yaml", cfg)
    say(f"JoeyNMT {stem}: training {steps} updates")
    proc = run_joey(s, ["train", str(path), "-t"], s.work / f"train_{stem}.log")
    skip = max(s.joey_warmup, s.joey_logging_freq)
    parsed = parse_train_log(proc.log.read_text(errors="replace"), s.joey_logging_freq, skip)
    stats = checkpoint_stats(model_dir / "latest.ckpt")
    per_step = stats["total_tokens"] / max(stats["steps"], 1)
    if train.get("batch_type", "sentence") == "sentence":
        sentences, how = float(train["batch_size"]), "batch_size"
    else:
        sentences, how = per_step / tokens_per_sentence, "estimated"
    startup = parsed.pop("first_log_time") - proc.started
    params = re.findall(r"Total params: (\d+)", proc.log.read_text(errors="replace"))
    return {
        "config": stem,
        "batch_size": train["batch_size"],
        "batch_type": train.get("batch_type", "sentence"),
        "parameters": int(params[0]) if params else None,
        "updates": stats["steps"],
        "left_out_steps": skip,
        **parsed,
        "tgt_tokens_per_step_mean": per_step,
        "sentences_per_step_mean": sentences,
        "sentences_per_step_source": how,
        "startup_seconds": startup,
        "process_seconds": proc.seconds,
        "peak_rss_bytes": proc.peak_rss_bytes,
        "checkpoint": str((model_dir / "latest.ckpt").resolve()),
        "log": str(proc.log),
    }


def test_subset(s: Settings, test_prefix: str) -> str:
    """The JoeyNMT data prefix of the first ``s.sentences`` test sentences."""
    src = s.joey_dir / f"{test_prefix}.de"
    with src.open(encoding="utf-8") as f:
        total = sum(1 for _ in f)
    if s.sentences >= total:
        return test_prefix
    prefix = s.work / f"test_first{s.sentences}"
    for lang in ("de", "en"):
        lines = (s.joey_dir / f"{test_prefix}.{lang}").read_text(encoding="utf-8").splitlines()
        Path(f"{prefix}.{lang}").write_text("\n".join(lines[: s.sentences]) + "\n")
    return str(prefix)


def joey_decode(
    s: Settings, stem: str, ckpt: Path, beam: int, tokenizer: JoeyTokenizer
) -> dict[str, Any]:
    """JoeyNMT ``test`` on the test subset with one checkpoint and beam size."""
    cfg = joey_config(s, stem)
    decode_dir = s.work / "decode"
    decode_dir.mkdir(parents=True, exist_ok=True)
    cfg["model_dir"] = str(decode_dir)
    cfg["use_cuda"] = False
    cfg["fp16"] = False
    cfg["data"].pop("train", None)
    cfg["data"].pop("dev", None)
    cfg["data"]["test"] = test_subset(s, cfg["data"]["test"])
    cfg["testing"].update(
        load_model=str(ckpt), beam_size=beam, max_output_length=s.max_output_length
    )
    if s.fixed_length:  # EOS blocked at every step before the cap
        cfg["testing"]["min_output_length"] = s.max_output_length
    name = f"{stem}.beam{beam}"
    path = write_yaml(s.work / f"decode_{name}.yaml", cfg)
    out = decode_dir / name
    say(f"JoeyNMT {stem}: decoding {s.sentences} sentences, beam {beam}")
    proc = run_joey(s, ["test", str(path), "-o", str(out)], s.work / f"decode_{name}.log")
    found = GEN_LINE.findall(proc.log.read_text(errors="replace"))
    if not found:
        raise RuntimeError(f"no 'Generation took' line in {proc.log}")
    seconds = float(found[-1])
    hyps = Path(f"{out}.test").read_text(encoding="utf-8").splitlines()
    # encoding the detokenized text again can split it a little differently: clip to the cap
    lengths = [min(n, s.max_output_length) for n in tokenizer.count(hyps)]
    stats = decode_stats(lengths, seconds, s.max_output_length)
    stats.update(
        batch=f"{cfg['testing']['batch_size']} {cfg['testing'].get('batch_type', 'sentence')}s",
        process_seconds=proc.seconds,
        peak_rss_bytes=proc.peak_rss_bytes,
        hypotheses=f"{out}.test",
        log=str(proc.log),
    )
    return stats


def decode_stats(lengths: Sequence[int], seconds: float, cap: int) -> dict[str, Any]:
    """Speed and output lengths of a decoding run; ``lengths`` exclude EOS."""
    steps = [min(n + 1, cap) for n in lengths]
    n = max(len(lengths), 1)
    return {
        "sentences": len(lengths),
        "seconds": seconds,
        "sentences_per_s": len(lengths) / seconds,
        "decoder_steps": sum(steps),
        "decoder_steps_per_s": sum(steps) / seconds,
        "mean_output_tokens": sum(lengths) / n,
        "capped_share": sum(x >= cap for x in steps) / n,
    }

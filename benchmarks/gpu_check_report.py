"""The printed summary of the GPU check (:mod:`benchmarks.gpu_check`): the environment, a table
of the parts (status, figures, seconds), the notes of those that failed, were skipped or ran a
fallback, and the quality part's validation BLEU over time, throughput, MFU and test scores."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.gpu_check_env import describe
from benchmarks.report import table

STATUSES = ("passed", "fallback", "failed", "skipped")


def _fmt(x: float | None, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def parts_table(parts: list[dict[str, Any]]) -> str:
    rows = [
        [p["part"], p["status"], p["summary"] or p["note"].split("\n", 1)[0], f"{p['seconds']:.0f}"]
        for p in parts
    ]
    return table(["part", "status", "figures", "seconds"], rows, align="lllr")


def notes(parts: list[dict[str, Any]]) -> list[str]:
    """Each part's note (a failure's message and log lines, why it was skipped, what its
    fallback ran), indented under its name."""
    lines = []
    for p in parts:
        if p["note"]:
            text = p["note"].replace("\n", "\n    ")
            lines.append(f"  {p['part']} ({p['status']}): {text}")
    return lines


def report(result: dict[str, Any]) -> str:
    env, parts = result["environment"], result["parts"]
    counts = Counter(p["status"] for p in parts)
    tally = ", ".join(f"{counts[s]} {s}" for s in STATUSES)
    where = env.get("device_name") or env["device"]
    lines = [
        *describe(env),
        "",
        f"GPU check on {where}: {tally} in {result['seconds']:.0f} s",
        parts_table(parts),
    ]
    if any(p["note"] for p in parts):
        lines += ["", "notes:", *notes(parts)]
    quality = next((p for p in parts if p["part"] == "quality" and p["figures"]), None)
    if quality:
        lines += ["", quality_report(quality["figures"])]
    return "\n".join(lines)


def quality_report(q: dict[str, Any]) -> str:
    """The quality part: training, validation BLEU over time, throughput and MFU, test scores
    and the goal."""
    train, peak = q["training"], q["peak"]
    summary = train["summary"]
    lines = [
        f"quality: matmul peak ({q['precision']}, measured): {peak['tflops']:.1f} TFLOP/s",
        f"training: {train['model'].get('parameters', 0):,} parameters, "
        f"{summary['step']} updates, {summary['epoch']} epochs, "
        f"{summary['train_time']:.0f} s of training; {summary['stop_reason']}",
        "validation BLEU over time (greedy, validation split; wall s since training began):",
    ]
    rows = [
        [f"{v['since_train_start_s']:.0f}", str(v["step"]), f"{v['bleu']:.2f}",
         f"{v['chrf']:.2f}", f"{v['loss']:.3f}"]
        for v in train["validation_history"]
    ]  # fmt: skip
    lines.append(table(["wall s", "step", "BLEU", "chrF", "loss"], rows))
    if train["averaged"]:
        avg = train["averaged"]
        lines.append(f"averaged {len(avg['checkpoints'])} checkpoints: validation BLEU "
                     f"{avg['bleu']:.2f}")  # fmt: skip
    lines += ["", "throughput (target tokens/s):", throughput(q), ""]
    for name, t in (q.get("test") or {}).items():
        ev = q["evaluation"]
        opts = ev.get("options", {})
        lines.append(
            f"test {name}: BLEU {t['bleu']:.2f}, chrF {_fmt(t['chrf'], '.2f')} "
            f"({Path(ev['checkpoint']).name}, beam {opts.get('beam')}, {t['sentences']} sentences)"
        )
    g = q["goal"]
    first = g["first_validation_at_target"]
    if first:
        lines.append(
            f"validation BLEU first reached {g['target_bleu']:g} at step {first['step']}, "
            f"{first['since_train_start_s']:.0f} s after training began"
        )
    verdict = "MET" if g["met"] else "NOT MET"
    lines.append(
        f"goal: {g['target_bleu']:g} BLEU on {g['test_set']} in {_fmt(g['train_seconds'], '.0f')} s"
        f" of training: {verdict} ({_fmt(g['test_bleu'], '.2f')})"
    )
    phases = ", ".join(f"{k} {v:.0f} s" for k, v in q["phase_seconds"].items())
    lines.append(f"time: {phases}")
    return "\n".join(lines)


def throughput(q: dict[str, Any]) -> str:
    """The training log's and the bench's tokens/s, TFLOP/s and MFU."""
    rows = []
    tps = q["training"]["tgt_tokens_per_s"]
    if tps:
        rows.append(["training (log)", f"{tps['median']:.0f}",
                     _fmt(q.get("train_achieved_tflops"), ".3g"),
                     _fmt(q.get("train_mfu"), ".1%")])  # fmt: skip
    b = q.get("bench")
    if b:
        rows.append([f"bench ({b['steps']} steps)", f"{b['tgt_tokens_per_s']:.0f}",
                     f"{b['achieved_tflops']:.3g}", f"{b['mfu']:.1%}"])  # fmt: skip
    return table(["", "tgt tok/s", "TFLOP/s", "MFU"], rows)

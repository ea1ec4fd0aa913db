"""The printed summary of the GPU check (:mod:`benchmarks.gpu_check`): device and peak,
validation BLEU over time, throughput and MFU, test scores and the goal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.report import table


def _fmt(x: float | None, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def report(result: dict[str, Any]) -> str:
    m, train = result["machine"], result["training"]
    summary = train["summary"]
    peak = result["peak"]
    lines = [
        f"device: {m['device_name']} ({m['device']}), torch {m['torch']}, python {m['python']}",
        f"matmul peak ({result['precision']}, measured): {peak['tflops']:.1f} TFLOP/s",
        "",
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
    tps = train["tgt_tokens_per_s"]
    lines += ["", "throughput (target tokens/s):"]
    rows = []
    if tps:
        mfu = result.get("train_mfu")
        achieved = result.get("train_achieved_tflops")
        rows.append(["training (log)", f"{tps['median']:.0f}", _fmt(achieved, ".3g"),
                     _fmt(mfu, ".1%")])  # fmt: skip
    b = result.get("bench")
    if b:
        rows.append([f"bench ({b['steps']} steps)", f"{b['tgt_tokens_per_s']:.0f}",
                     f"{b['achieved_tflops']:.3g}", f"{b['mfu']:.1%}"])  # fmt: skip
    lines.append(table(["", "tgt tok/s", "TFLOP/s", "MFU"], rows))
    lines.append("")
    for name, t in (result.get("test") or {}).items():
        ev = result["evaluation"]
        opts = ev.get("options", {})
        lines.append(
            f"test {name}: BLEU {t['bleu']:.2f}, chrF {_fmt(t['chrf'], '.2f')} "
            f"({Path(ev['checkpoint']).name}, beam {opts.get('beam')}, {t['sentences']} sentences)"
        )
    g = result["goal"]
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
    phases = ", ".join(f"{k} {v:.0f} s" for k, v in result["phase_seconds"].items())
    lines.append(f"time: {phases}; total {result['seconds']:.0f} s")
    return "\n".join(lines)

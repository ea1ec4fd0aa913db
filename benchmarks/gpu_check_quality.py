"""The GPU check's quality part (``--parts quality``; :mod:`benchmarks.gpu_check`): the
default Transformer trained on Multi30k for 3 minutes in bf16, measured.

1. measures the device's matrix-product peak in the training precision
   (:func:`benchmarks.machine.matmul_peak`);
2. trains ``experiment=gpu_quick`` (``python -m nmt.train``) for ``--train-seconds`` of
   training time, and reads the run's events (``metrics.jsonl``, :mod:`nmt.train.runlog`) for the
   validation BLEU against wall-clock time and the training throughput (target tokens/s);
3. times real training steps of the trained configuration
   (:func:`benchmarks.timing.time_training`): target tokens/s, achieved TFLOP/s and model FLOPs
   utilisation against the measured peak;
4. scores the run as it is meant to be decoded (beam 5; the averaged weights if they beat the
   best checkpoint on validation) on the test split (``python -m nmt.evaluate``);
5. checks the test BLEU against ``--goal-bleu``.

Standard library only at load time.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_check import CheckFailed, Context, GpuCheckSettings, Outcome, with_defaults
from benchmarks.gpu_check_runs import run_logged, tokens_per_s

TEST_SET = "test_2016_flickr"


def run_history(events: list[dict[str, Any]], started: float) -> dict[str, Any]:
    """What the check reports of a training run, from its events (:func:`nmt.train.runlog.
    read_events`): validation BLEU over time, the log windows' throughput, epochs, the averaged
    checkpoint. ``wall_s`` is seconds since the training process started (Unix time
    ``started``); ``since_train_start_s`` since the run's ``start`` event."""
    from nmt.train.runlog import of_kind

    def wall(e: dict[str, Any]) -> float:
        return round(e["time"] - started, 2)

    starts = of_kind(events, "start")
    first = starts[0] if starts else None
    train_start = wall(first) if first else None

    def since_start(e: dict[str, Any]) -> float:
        return round(wall(e) - train_start, 2) if train_start is not None else 0.0

    validations = [
        {"step": v["step"], "loss": v["loss"], "ppl": v["ppl"], "bleu": v["bleu"],
         "chrf": v["chrf"], "seconds": v["seconds"], "wall_s": wall(v),
         "since_train_start_s": since_start(v)}
        for v in of_kind(events, "validation")
    ]  # fmt: skip
    trains = of_kind(events, "train")
    windows = [
        {"step": t["step"], "loss": t["loss"], "lr": t["lr"],
         "tgt_tokens_per_s": t["tokens_per_s"], "wall_s": wall(t)}
        for t in trains
    ]  # fmt: skip
    # an epoch's end: the last window logged in it (the events have no epoch-end event)
    epochs = [
        {"epoch": a["epoch"], "step": a["step"], "wall_s": wall(a)}
        for a, b in zip(trains, trains[1:], strict=False)
        if b["epoch"] > a["epoch"]
    ]
    averaged = of_kind(events, "averaged")
    avg = averaged[-1] if averaged else None
    model = {}
    if first:
        model = {"parameters": first.get("parameters"), "device": first.get("device_type")}
    return {
        "model": model,
        "train_pairs": first.get("train_pairs") if first else None,
        "batches_per_epoch": first.get("batches_per_epoch") if first else None,
        "train_start_wall_s": train_start,
        "validation_history": validations,
        "validation_seconds_total": sum(v["seconds"] for v in validations),
        "averaged": {
            "checkpoints": avg["checkpoints"],
            "loss": avg.get("loss"),
            "bleu": avg["bleu"],
            "chrf": avg.get("chrf"),
            "wall_s": wall(avg),
        }
        if avg
        else None,  # fmt: skip
        "log_windows": windows,
        "epochs": epochs,
        "tgt_tokens_per_s": tokens_per_s(windows),
    }


def train_command(s: GpuCheckSettings, run_dir: Path) -> list[str]:
    defaults = [
        f"experiment={s.experiment}",
        f"trainer.device={s.device}",
        f"trainer.max_time={s.train_seconds}",
        "trainer.progress=false",
        f"outputs={run_dir.parent}",
        f"hydra.run.dir={run_dir}",
        f"data.root={s.repo / 'data'}",
    ]
    return [sys.executable, "-m", "nmt.train", *with_defaults(defaults, s.override)]


def run_training(ctx: Context, run_dir: Path) -> dict[str, Any]:
    from benchmarks.report import run_summary
    from nmt.train.runlog import METRICS_FILE, read_events

    cmd = train_command(ctx.s, run_dir)
    started = time.time()
    run_logged(ctx, cmd, run_dir.parent / f"{run_dir.name}.console.log")
    events = read_events(run_dir)
    summary = run_summary(run_dir)
    if not events or summary is None:
        raise CheckFailed(f"training wrote no {run_dir / METRICS_FILE}")
    history = run_history(events, started)
    history["model"] = {"class": model_class(run_dir), **history["model"]}
    return {"run_dir": str(run_dir), "command": cmd[1:], "summary": summary, **history}


def model_class(run_dir: Path) -> str:
    """The class name of the run's model (its config's ``model.arch``)."""
    from nmt.models.registry import MODELS
    from nmt.store.gate import load_run_config

    arch = load_run_config(run_dir).model.arch
    return MODELS[arch].__name__ if arch in MODELS else str(arch)


def measure_peak(device: Any, precision: str, s: GpuCheckSettings) -> dict[str, Any]:
    from benchmarks.machine import PRECISION_DTYPES, matmul_peak

    n = s.matmul_n or (8192 if device.type == "cuda" else 512)
    samples, seconds = (7, 0.2) if device.type == "cuda" else (3, 0.05)
    return matmul_peak(device, PRECISION_DTYPES[precision], n, samples, seconds)


def run_bench(
    run_dir: Path, device: Any, precision: str, peak_tflops: float, s: GpuCheckSettings
) -> dict[str, Any]:
    """The training steps of the trained run's own config, data and tokenizers, timed."""
    from omegaconf import OmegaConf

    from benchmarks.timing import StepSettings, time_training
    from nmt.data.datasets import prepare_data
    from nmt.data.tokenizer import TokenizerPair
    from nmt.environment import multi30k_source
    from nmt.store.checkpoint import load_checkpoint

    payload = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    cfg = OmegaConf.create(payload["config"])
    tokenizers = TokenizerPair.from_state_dict(payload["tokenizers"])
    del payload
    data = prepare_data(cfg.data, tokenizers, multi30k_source())
    steps = StepSettings(device, s.bench_steps, s.bench_warmup)
    return time_training(cfg, data, precision, steps, peak_tflops)


def run_eval(ctx: Context, run_dir: Path) -> dict[str, Any]:
    out_dir = run_dir / "eval"
    cmd = [sys.executable, "-m", "nmt.evaluate", f"run={run_dir}", f"device={ctx.s.device}"]
    cmd += [f"out={out_dir}", "progress=false"]
    before = set(out_dir.glob("scores.*.json"))
    run_logged(ctx, cmd, run_dir.parent / f"{run_dir.name}.eval.log")
    new = sorted(set(out_dir.glob("scores.*.json")) - before, key=lambda p: p.stat().st_mtime)
    if not new:
        raise CheckFailed(f"evaluation wrote no scores into {out_dir}")
    return json.loads(new[-1].read_text())


def test_scores(evaluation: dict[str, Any]) -> dict[str, Any]:
    """{set name: {"bleu", "chrf", "sentences"}} from nmt.evaluate's report."""
    out = {}
    for name, s in evaluation.get("sets", {}).items():
        scores = s["scores"]
        out[name] = {
            "bleu": scores["BLEU"]["score"],
            "chrf": scores.get("chrF2", {}).get("score"),
            "bleu_signature": scores["BLEU"]["signature"],
            "sentences": s["sentences"],
        }
    return out


def goal(result: dict[str, Any], target: float) -> dict[str, Any]:
    """Whether the test BLEU reached ``target`` with the training time of this run."""
    tests = result.get("test") or {}
    name = TEST_SET if TEST_SET in tests else next(iter(tests), None)
    bleu = tests[name]["bleu"] if name else None
    train = result.get("training") or {}
    history = train.get("validation_history") or []
    first = next((v for v in history if v["bleu"] >= target), None)
    return {
        "target_bleu": target,
        "test_set": name,
        "test_bleu": bleu,
        "train_seconds": (train.get("summary") or {}).get("train_time"),
        "met": bleu is not None and bleu >= target,
        "first_validation_at_target": first,
    }


def add_bench(ctx: Context, result: dict[str, Any], device: Any) -> None:
    """The timed bench of the trained run, and the training's MFU from it."""
    train, peak, precision = result["training"], result["peak"], result["precision"]
    result["bench"] = run_bench(Path(train["run_dir"]), device, precision, peak["tflops"], ctx.s)
    tps = train["tgt_tokens_per_s"]
    if tps:
        flops = result["bench"]["train_flops_per_tgt_token"] * tps["median"]
        result["train_achieved_tflops"] = flops / 1e12
        result["train_mfu"] = flops / 1e12 / peak["tflops"]


def quality(ctx: Context) -> Outcome:
    """Every step of the module docstring; the result the report's quality section prints."""
    import torch
    from omegaconf import OmegaConf

    from nmt.runtime.precision import resolve_precision

    s, phases = ctx.s, {}
    device = torch.device(s.device)
    result: dict[str, Any] = {}
    tic = time.perf_counter()
    peaks = {"bf16": measure_peak(device, "bf16", s)}
    phases["peak"] = time.perf_counter() - tic
    run_dir = ctx.work / "quality" / "run"
    tic = time.perf_counter()
    result["training"] = train = run_training(ctx, run_dir)
    phases["training"] = time.perf_counter() - tic
    # the precision the run trained in (summary.json), else its config's resolved here
    precision = train["summary"].get("hardware", {}).get("precision") or resolve_precision(
        str(OmegaConf.load(run_dir / "config.yaml").trainer.precision), device
    )
    if precision not in peaks:
        peaks[precision] = measure_peak(device, precision, s)
    result.update(precision=precision, peak=peaks[precision], peaks=peaks)
    if s.bench_steps > 0:
        tic = time.perf_counter()
        add_bench(ctx, result, device)
        phases["bench"] = time.perf_counter() - tic
    if not s.no_eval:
        tic = time.perf_counter()
        result["evaluation"] = run_eval(ctx, run_dir)
        result["test"] = test_scores(result["evaluation"])
        phases["evaluation"] = time.perf_counter() - tic
    result["goal"] = g = goal(result, s.goal_bleu)
    result["phase_seconds"] = phases
    bleu = "-" if g["test_bleu"] is None else f"{g['test_bleu']:.2f}"
    mfu = f", MFU {result['train_mfu']:.1%}" if "train_mfu" in result else ""
    summary = (
        f"test BLEU {bleu} (goal {g['target_bleu']:g}: {'met' if g['met'] else 'not met'}){mfu}"
    )
    return Outcome(summary, result)

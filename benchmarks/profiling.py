"""Where the time of a training step and of a decoding run goes: ``make bench ARGS="--profile"``.

Real training steps (``nmt.train.step.train_step``) of a freshly built model, and the library's
batched greedy and beam search over the test set, run under ``torch.profiler`` after a warm-up.
The time is grouped three ways:

- **phases** of a step: building the batch, the forward pass with the loss, the backward pass,
  the gradient norm (clipping) and the optimizer step (``train_step`` labels them);
- **modules**: the forward time of each submodule, layers of a stack pooled (``encoder.layers.*``
  is every encoder layer). A module's time includes its children's, so the rows nest and do not
  add up; the backward pass has no module rows (autograd runs operators, not modules);
- **operators**: each operator's self time (its own, without the operators it calls), and the
  same pooled into kinds (matrix products, casts and copies, normalisation, softmax, ...).

Shares are of the profiled wall time. The profiler adds a little to each operator, so its step
time is above ``make bench``'s; the shares are what this measures.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from omegaconf import DictConfig
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.machine import MatmulSettings, machine_info, synchronize
from benchmarks.report import say as _say
from benchmarks.report import table
from benchmarks.speed import DataCache, Settings, envelope, train_config
from benchmarks.timing import (
    StepSettings,
    WeightSource,
    decode_subject,
    decode_with_search,
    training_batches,
)
from nmt.data.batching import make_batch
from nmt.data.datasets import PreparedData
from nmt.decode.options import DecodeOptions
from nmt.runtime.distributed import DistInfo
from nmt.store.loading import build_model
from nmt.train.optim import build_optimizer, build_scheduler
from nmt.train.step import PHASE_PREFIX, train_step

SCHEMA = "nmt-bench-profile/1"
MODULE_PREFIX = "module::"
BATCH_PHASE = PHASE_PREFIX + "batch"
DEFINITIONS = {
    "seconds_per_step": "seconds per profiled training step (per decoding run for decode)",
    "share": "of the profiled wall time",
    "phases": "train_step's parts (batch, forward with the loss, backward, clip, optimizer), "
    "inclusive",
    "modules": "each submodule's forward, layers of a stack pooled as *, inclusive: rows nest",
    "operators": "self time of each operator (without the operators it calls)",
    "operator_kinds": "operators' self time pooled by kind (benchmarks.profiling.KINDS)",
    "operator_self_share": "all operators' self time over the wall time: the rest is Python "
    "and the profiler outside any operator",
}
TOP_OPERATORS = 25  # operator rows kept in the report (the rest pooled as "other")
MODULE_DEPTH = 3  # module rows shown in the printed table: names of at most this many parts

# kinds of operators, first match wins; anything else is "other"
KINDS: list[tuple[str, re.Pattern[str]]] = [
    ("matrix products", re.compile(r"aten::(mm|bmm|addmm|baddbmm|matmul|linear|_int_mm|addbmm)$")),
    ("casts and copies", re.compile(r"aten::(to|_to_copy|copy_|clone|contiguous)$")),
    ("normalisation", re.compile(r"aten::(native_)?layer_norm|aten::rms_norm|norm")),
    ("softmax", re.compile(r"softmax")),
    ("dropout and masks", re.compile(r"dropout|bernoulli|masked_fill|aten::where")),
    ("optimizer", re.compile(r"aten::_foreach_|aten::_fused_adam|Optimizer")),
    ("gather and scatter", re.compile(r"index|gather|scatter|embedding|take")),
    ("reshapes and views", re.compile(r"aten::(view|reshape|transpose|permute|t|expand|"
                                      r"unsqueeze|squeeze|slice|select|as_strided|split|"
                                      r"chunk|cat|stack|flatten|unflatten|narrow)$")),
    ("elementwise", re.compile(r"aten::(add|mul|sub|div|relu|gelu|tanh|sigmoid|exp|log|"
                               r"neg|sqrt|rsqrt|pow|threshold|fill|zero|sum|mean|max|min|"
                               r"eq|ne|lt|gt|le|ge|abs|clamp|addcmul|addcdiv|lerp|ones|zeros|"
                               r"empty|full|arange|rsub|log_softmax|_log_softmax|nll)")),
    ("backward glue", re.compile(r"^autograd::|Backward")),
]  # fmt: skip


def kind_of(name: str) -> str:
    """The kind an operator's name belongs to (:data:`KINDS`), else "other"."""
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "other"


def module_label(name: str) -> str:
    """The label of a submodule's forward: its qualified name, layer indices pooled as ``*``."""
    return MODULE_PREFIX + re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", name)


@contextmanager
def labelled_modules(model: torch.nn.Module) -> Iterator[None]:
    """Every submodule's forward runs inside a profiler range named by :func:`module_label`."""
    ranges: list[record_function] = []

    def enter(label: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any) -> None:
            rf = record_function(label)
            rf.__enter__()
            ranges.append(rf)

        return hook

    def leave(module: torch.nn.Module, args: Any, output: Any) -> None:
        ranges.pop().__exit__(None, None, None)

    handles = []
    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_pre_hook(enter(module_label(name))))
            handles.append(module.register_forward_hook(leave))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@dataclass
class Totals:
    """The profiled events pooled: inclusive seconds of our ranges, self seconds of operators."""

    wall: float
    phases: dict[str, float]
    modules: dict[str, float]
    operators: dict[str, tuple[float, int]]  # name -> (self seconds, calls)


def totals(prof: profile, wall: float) -> Totals:
    """Pool ``prof``'s events: our labelled ranges (inclusive time) and operators (self time)."""
    phases: dict[str, float] = {}
    modules: dict[str, float] = {}
    operators: dict[str, tuple[float, int]] = {}
    for ev in prof.key_averages():
        if ev.key.startswith(PHASE_PREFIX):
            phases[ev.key[len(PHASE_PREFIX) :]] = ev.cpu_time_total / 1e6
        elif ev.key.startswith(MODULE_PREFIX):
            modules[ev.key[len(MODULE_PREFIX) :]] = ev.cpu_time_total / 1e6
        elif ev.self_cpu_time_total > 0:
            operators[ev.key] = (ev.self_cpu_time_total / 1e6, ev.count)
    return Totals(wall, phases, modules, operators)


def shares(t: Totals, steps: int) -> dict[str, Any]:
    """The JSON of one profile: per-step seconds and shares of the wall time."""

    def row(seconds: float) -> dict[str, float]:
        return {"seconds_per_step": seconds / steps, "share": seconds / t.wall}

    ranked = sorted(t.operators.items(), key=lambda kv: -kv[1][0])
    top = {name: {**row(sec), "calls_per_step": calls / steps} for name, (sec, calls) in ranked}
    kinds: dict[str, float] = {}
    for name, (sec, _) in t.operators.items():
        kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + sec
    return {
        "steps": steps,
        "wall_seconds_per_step": t.wall / steps,
        "phases": {k: row(v) for k, v in sorted(t.phases.items(), key=lambda kv: -kv[1])},
        "modules": {k: row(v) for k, v in sorted(t.modules.items(), key=lambda kv: -kv[1])},
        "operator_kinds": {k: row(v) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
        "operators": dict(list(top.items())[:TOP_OPERATORS]),
        "operators_other": row(sum(sec for _, (sec, _c) in ranked[TOP_OPERATORS:])),
        "operator_self_share": sum(sec for sec, _ in t.operators.values()) / t.wall,
    }


def profile_training(
    cfg: DictConfig, data: PreparedData, precision: str, s: StepSettings
) -> dict[str, Any]:
    """``s.warmup`` untimed steps, then ``s.steps`` steps under the profiler."""
    cfg = copy.deepcopy(cfg)
    cfg.trainer.precision = precision
    batches = training_batches(cfg, data, s.warmup + s.steps)
    torch.manual_seed(cfg.trainer.seed)
    model = build_model(cfg, data.tokenizers).to(s.device)
    model.train()
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim, cfg.trainer.max_steps)

    def step(idx: list[int]) -> None:
        with record_function(BATCH_PHASE):
            batch = make_batch(data.train, idx).to(s.device, non_blocking=True)
        train_step(model, [batch], optimizer, None, cfg, s.device, DistInfo())
        scheduler.step()

    for idx in batches[: s.warmup]:
        step(idx)
    activities = [ProfilerActivity.CPU]
    if s.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with labelled_modules(model), profile(activities=activities) as prof:
        synchronize(s.device)
        tic = time.perf_counter()
        for idx in batches[s.warmup :]:
            step(idx)
        synchronize(s.device)
        wall = time.perf_counter() - tic
    return {"precision": precision, **shares(totals(prof, wall), s.steps)}


def profile_decoding(
    model_name: str,
    cfg: DictConfig,
    data: PreparedData,
    device: torch.device,
    source: WeightSource,
    sentences: int,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Batched greedy and beam search over the first ``sentences`` test sentences."""
    subject = decode_subject(model_name, cfg, data, device, source, say)
    n = min(sentences, len(subject.test.data)) if sentences > 0 else len(subject.test.data)
    base = DecodeOptions(max_tokens=cfg.data.eval_max_tokens)
    decode_with_search(subject, base, min(16, n), device)  # warm-up
    runs: dict[str, Any] = {}
    for name, beam in (("greedy_batched", 1), ("beam5_batched", 5)):
        opts = replace(base, beam=beam)
        say(f"profiling {model_name} decoding: {name} on {n} sentences")
        with (
            labelled_modules(subject.model),
            profile(activities=[ProfilerActivity.CPU]) as prof,
            record_function(PHASE_PREFIX + "search"),
        ):
            _, wall = decode_with_search(subject, opts, n, device)
        runs[name] = {"sentences": n, **shares(totals(prof, wall), 1)}
    return {"weights": subject.weights, "checkpoint": subject.checkpoint, "runs": runs}


# ------------------------------------------------------------------------------ report


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def profile_tables(title: str, p: dict[str, Any], per: str = "step") -> str:
    """The readable form of one profile: phases, operator kinds, modules and top operators."""
    lines = [f"{title}: {p['wall_seconds_per_step']:.3f} s per {per}"]
    phase_rows = [
        [k, f"{v['seconds_per_step']:.4f}", _pct(v["share"])] for k, v in p["phases"].items()
    ]
    lines += ["", table(["phase", f"s/{per}", "share"], phase_rows)]
    kind_rows = [
        [k, f"{v['seconds_per_step']:.4f}", _pct(v["share"])]
        for k, v in p["operator_kinds"].items()
    ]
    lines += ["", table(["operator kind (self time)", f"s/{per}", "share"], kind_rows)]
    module_rows = [
        [k, f"{v['seconds_per_step']:.4f}", _pct(v["share"])]
        for k, v in p["modules"].items()
        if k.count(".") < MODULE_DEPTH
    ]
    if module_rows:
        lines += ["", table(["module forward (inclusive)", f"s/{per}", "share"], module_rows)]
    op_rows = [
        [
            k,
            kind_of(k),
            f"{v['calls_per_step']:.0f}",
            f"{v['seconds_per_step']:.4f}",
            _pct(v["share"]),
        ]
        for k, v in p["operators"].items()
    ]
    other = p["operators_other"]
    op_rows.append(
        ["(other operators)", "", "", f"{other['seconds_per_step']:.4f}", _pct(other["share"])]
    )
    lines += ["", table(["operator (self time)", "kind", "calls", f"s/{per}", "share"], op_rows)]
    return "\n".join(lines)


def report(result: dict[str, Any]) -> str:
    """Every profile of the result as text tables."""
    mach = result["machine"]
    lines = [
        f"device: {mach['device_name']} ({mach['device']}), torch {mach['torch']}, "
        f"{mach['torch_threads']} threads"
    ]
    for model, m in result["models"].items():
        for prec, p in m["train"].items():
            lines += ["", profile_tables(f"{model} training step, {prec}", p)]
        for name, p in m.get("decode", {}).get("runs", {}).items():
            lines += [
                "",
                profile_tables(f"{model} decoding, {name} ({p['sentences']} sentences)", p, "run"),
            ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ main


def say(msg: str) -> None:
    """Progress on stderr (the tables go to stdout)."""
    _say("profile", msg)


def run(s: Settings) -> dict[str, Any]:
    """Profile training in each of the settings' precisions, then decoding, of each model."""
    start = time.perf_counter()
    matmul = MatmulSettings(s.matmul_n, s.matmul_samples, s.matmul_seconds)
    machine = machine_info(s.device, matmul, say)
    data_cache = DataCache()
    source = WeightSource(s.checkpoints, s.runs_dir, s.data_root)
    models: dict[str, Any] = {}
    for model in s.models:
        cfg = train_config(model, s)
        data = data_cache.get(cfg)
        m: dict[str, Any] = {"train": {}}
        for precision in s.precisions:
            say(f"profiling {model} training in {precision}: {s.warmup} + {s.steps} steps")
            steps = StepSettings(s.device, s.steps, s.warmup)
            m["train"][precision] = profile_training(cfg, data, precision, steps)
        if s.decode:
            m["decode"] = profile_decoding(
                model, cfg, data, s.device, source, s.decode_sentences, say
            )
        models[model] = m
    settings = {
        "models": s.models,
        "precisions": s.precisions,
        "overrides": s.overrides,
        "steps": s.steps,
        "warmup": s.warmup,
        "decode_sentences": s.decode_sentences,
    }
    return envelope(SCHEMA, s, settings, DEFINITIONS, machine, models, start)

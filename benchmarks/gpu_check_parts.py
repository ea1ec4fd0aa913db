"""The parts of the GPU check (:mod:`benchmarks.gpu_check`), one function each, and their
table (:data:`PARTS`): name, what it runs, its function, its time budget, its groups.

Each part runs the real command lines as subprocesses (:mod:`benchmarks.gpu_check_runs`),
returns an :class:`~benchmarks.gpu_check.Outcome`, raises
:class:`~benchmarks.gpu_check.PartSkipped` where it cannot run here and anything else where
it fails. Standard library only at load time.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.gpu_check import (
    CheckFailed,
    Context,
    GpuCheckSettings,
    Outcome,
    Part,
    PartSkipped,
)
from benchmarks.gpu_check_runs import (
    MODELS,
    PRECISIONS,
    RunSpec,
    child_env,
    free_port,
    kill_group,
    limits,
    log_tail,
    loss_text,
    needs_native_bf16,
    rate_text,
    run_folder,
    run_logged,
    spawn,
    train,
    train_command,
    train_overrides,
    trained_figures,
)

MODEL_NAMES = {"transformer": "Transformer", "gru": "GRU+Bahdanau"}


def fast_precision(ctx: Context) -> str:
    """The mixed precision this device trains in: bf16 from compute capability 8.0, fp16 on
    an older GPU, fp32 on a CPU."""
    if not ctx.cuda:
        return "fp32"
    return "bf16" if ctx.native_bf16 else "fp16"


def last_checkpoint(run_dir: Path) -> dict[str, Any]:
    from nmt.store.checkpoint import load_checkpoint

    return load_checkpoint(run_dir / "checkpoints" / "last.pt")


# ------------------------------------------------------------------------------ precisions

AUTOCAST_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # what the GRU's kernel must run in


def gru_kernel_dtype(device: str, precision: str) -> str:
    """The dtype the GRU encoder's recurrent kernel (cuDNN's on a GPU) computes in, under the
    autocast of training in ``precision``: a small GRU model's forward pass on ``device``, its
    encoder's packed output read by a hook."""
    import torch

    from nmt.models.gru import GRUBahdanau
    from nmt.runtime.device import autocast

    torch.manual_seed(0)
    model = GRUBahdanau(
        emb_dim=16, hidden_dim=16, enc_layers=1, dec_layers=1, bidirectional=True, dropout=0.0,
        attention="additive", attn_dim=16, tie_embeddings=False, src_vocab_size=32,
        tgt_vocab_size=32,
    ).to(device)  # fmt: skip
    seen: list[torch.dtype] = []
    model.encoder.register_forward_hook(lambda _m, _i, out: seen.append(out[0].data.dtype))
    src = torch.randint(3, 32, (4, 7), device=device)
    lens = torch.tensor([7, 6, 5, 3], device=device)
    with torch.no_grad(), autocast(PRECISIONS[precision], torch.device(device)):
        model(src, lens, torch.randint(3, 32, (4, 5), device=device))
    return str(seen[0]).removeprefix("torch.")


def checked_gru_dtype(ctx: Context, precision: str) -> str:
    """On a GPU, the GRU encoder must run in the autocast's dtype: cuDNN's RNN path under
    autocast casts its inputs itself, and a half-precision kernel under bf16 would train
    without the loss scaling fp16 needs. Elsewhere the dtype is reported."""
    dtype = gru_kernel_dtype(ctx.s.device, precision)
    if ctx.cuda and dtype != AUTOCAST_DTYPES[precision]:
        raise CheckFailed(
            f"under {precision} autocast the GRU encoder ran in {dtype}, not "
            f"{AUTOCAST_DTYPES[precision]}"
        )
    return dtype


def precision_part(ctx: Context, model: str, precision: str) -> Outcome:
    """A short run of ``model`` in ``precision``: tokens/s, and the loss must decrease."""
    if precision == "bf16":
        needs_native_bf16(ctx, "bf16 training")
    notes = []
    if precision == "fp32" and ctx.cuda:
        notes.append("TF32" if ctx.native_bf16 else "no TF32 on this GPU")
    name = f"{model}-{precision}"
    extra = ["trainer.tf32=true"] if precision == "fp32" else []  # nmt's default, stated
    try:
        run_dir = train(ctx, RunSpec(name, model, precision, extra))
    except CheckFailed as e:
        if precision == "fp16" and not ctx.cuda:  # fp16 training is nmt's on CUDA only
            first = str(e).split("\n", 1)[0]
            raise PartSkipped(f"needs CUDA: fp16 training failed on the CPU ({first})") from e
        raise
    figures = trained_figures(run_dir, precision)
    if model == "gru" and precision in AUTOCAST_DTYPES:
        figures["gru_encoder_dtype"] = checked_gru_dtype(ctx, precision)
        notes.append(f"encoder GRU in {figures['gru_encoder_dtype']}")
    if precision == "fp16":
        scaler = last_checkpoint(run_dir)["scaler"]
        if not scaler:
            raise CheckFailed("fp16 trained without a loss scaler (the checkpoint has none)")
        figures["loss_scale"] = scaler["scale"]
        notes.append(f"loss scale {scaler['scale']:g}")
    ctx.runs[name] = run_dir
    summary = ", ".join(
        [rate_text(figures), loss_text(figures), f"{figures['updates']} updates", *notes]
    )
    return Outcome(summary, figures)


# ------------------------------------------------------------------------------ resume

RESUME_STEPS = {False: (40, 10), True: (12, 4)}  # (max_steps, val_every) by --quick


def resume_spec(ctx: Context, name: str, *extra: str) -> RunSpec:
    """The run the resume part kills, resumes and repeats: the Transformer in fp32 with a
    checkpoint every val_every updates."""
    steps, every = RESUME_STEPS[ctx.s.quick]
    return RunSpec(
        name, "transformer", "fp32",
        [*limits(ctx, steps), f"trainer.val_every={every}", "trainer.patience=0", *extra],
    )  # fmt: skip


def kill_after_checkpoint(ctx: Context, spec: RunSpec) -> str:
    """Start ``spec``'s run and SIGKILL it (its process group) once its first step checkpoint
    is on disk; the checkpoint's name."""
    from nmt.store.checkpoint import step_checkpoints

    run_dir, outputs = run_folder(ctx, spec.name)
    log_file = outputs / "console.log"
    proc = spawn(train_command(ctx, spec, run_dir, outputs), ctx.s.repo, log_file, child_env())
    while not step_checkpoints(run_dir / "checkpoints"):
        if proc.poll() is not None:
            raise CheckFailed(
                f"the run ended (status {proc.returncode}) before its first checkpoint:\n"
                f"{log_tail(log_file)}"
            )
        if ctx.left() <= 0:
            kill_group(proc)
            raise CheckFailed("no checkpoint before the part's deadline")
        time.sleep(0.02)
    kill_group(proc)
    if proc.returncode == 0:
        raise CheckFailed("the run finished before the kill reached it")
    return step_checkpoints(run_dir / "checkpoints")[0].name


def difference(a: Path, b: Path) -> dict[str, Any]:
    """Which deterministic parts of two checkpoints differ (nmt.store.checkpoint.
    content_digest), and the largest absolute difference of their weights."""
    from nmt.store.checkpoint import content_digest, load_checkpoint

    pa, pb = load_checkpoint(a), load_checkpoint(b)
    da, db = content_digest(pa), content_digest(pb)
    parts = [k for k in da if da[k] != db.get(k)]
    gaps = ((pa["model"][k].double() - pb["model"][k].double()).abs().max() for k in pa["model"])
    largest = max((float(g) for g in gaps), default=0.0)
    return {"differs": parts, "max_abs_weight_diff": largest}


def resume_part(ctx: Context) -> Outcome:
    """SIGKILL after the first checkpoint, ``trainer.resume=auto``: the run must go on from
    that checkpoint's step to its end; then the same run without a kill, compared."""
    from nmt.store.checkpoint import load_checkpoint
    from nmt.train.runlog import of_kind, read_events
    from nmt.train.start import find_resume_checkpoint

    spec = resume_spec(ctx, "resume")
    killed_after = kill_after_checkpoint(ctx, spec)
    run_dir, outputs = run_folder(ctx, "resume")
    resume_file = find_resume_checkpoint("auto", outputs)
    if resume_file is None:
        raise CheckFailed(f"nothing to resume in {run_dir} after the kill")
    from_step = int(load_checkpoint(resume_file)["state"]["step"])
    again = resume_spec(ctx, "resume", "trainer.resume=auto")
    cmd = train_command(ctx, again, outputs / "resumed-session", outputs)
    run_logged(ctx, cmd, outputs / "console.log")
    start = of_kind(read_events(run_dir), "start")[-1]
    final = int(last_checkpoint(run_dir)["state"]["step"])
    steps = RESUME_STEPS[ctx.s.quick][0]
    if "resumed_from" not in start or start["step"] != from_step or final != steps:
        raise CheckFailed(
            f"killed after {killed_after}, the resumed session started at step {start['step']} "
            f"(its checkpoint: {from_step}) and ended at {final} of {steps}"
        )
    figures: dict[str, Any] = {"killed_after": killed_after, "resumed_at": from_step,
                               "final_step": final}  # fmt: skip
    note = compare_uninterrupted(ctx, run_dir, figures)
    summary = f"killed after {killed_after}, resumed at step {from_step}, ended at {final}"
    return Outcome(f"{summary}; {figures['same_as_uninterrupted']}", figures, note)


def compare_uninterrupted(ctx: Context, resumed: Path, figures: dict[str, Any]) -> str:
    """The resumed run against the same run uninterrupted, into ``figures``; where they
    differ, a second uninterrupted run tells the device's own nondeterminism (the two differ as
    well: the note says so) from a fault of resuming (they do not: CheckFailed)."""
    first = train(ctx, resume_spec(ctx, "resume-uninterrupted"))
    diff = difference(resumed / "checkpoints" / "last.pt", first / "checkpoints" / "last.pt")
    figures.update(diff)
    if not diff["differs"]:
        figures["same_as_uninterrupted"] = "bit-identical to an uninterrupted run"
        return ""
    second = train(ctx, resume_spec(ctx, "resume-uninterrupted-2"))
    repeat = difference(first / "checkpoints" / "last.pt", second / "checkpoints" / "last.pt")
    largest = f"{diff['max_abs_weight_diff']:.2g}"
    if not repeat["differs"]:
        raise CheckFailed(
            f"the resumed run differs from an uninterrupted one ({', '.join(diff['differs'])}; "
            f"weights by up to {largest}) though two uninterrupted runs are bit-identical"
        )
    figures["uninterrupted_runs_differ"] = repeat
    figures["same_as_uninterrupted"] = f"weights within {largest} of an uninterrupted run"
    return (
        "fp32 training does not repeat bit for bit on this device: two uninterrupted runs "
        f"differ too (weights by up to {repeat['max_abs_weight_diff']:.2g})"
    )


# ------------------------------------------------------------------------------ CTranslate2

TRANSFORMER_RUNS = ("transformer-bf16", "transformer-fp16", "transformer-fp32")
MIN_IDENTICAL = 0.9  # share of identical translations the two engines must reach


def cuda_library_path(env: dict[str, str]) -> str:
    """LD_LIBRARY_PATH with the CUDA libraries of pip's nvidia-* packages (cuBLAS, which
    CTranslate2 loads by name, comes with a pip install of torch there) added."""
    found = [str(p) for s in sys.path if s for p in sorted(Path(s).glob("nvidia/*/lib"))]
    old = env.get("LD_LIBRARY_PATH", "")
    return ":".join([*found, *([old] if old else [])])


def decode(ctx: Context, package: Path, engine: str) -> dict[str, Any]:
    """``nmt.evaluate`` of the package's test set with ``engine`` on the check's device,
    greedy: its hypotheses, BLEU and decoding seconds."""
    out = ctx.work / "ctranslate2" / engine
    cmd = [sys.executable, "-m", "nmt.evaluate", f"model={package}", f"engine={engine}",
           f"device={ctx.s.device}", "beam=1", "bootstrap=0", "progress=false",
           "tf32=false", f"out={out}"]  # fmt: skip
    env = child_env()
    if ctx.cuda:
        env["LD_LIBRARY_PATH"] = cuda_library_path(env)
    run_logged(ctx, cmd, ctx.work / "ctranslate2" / f"{engine}.log", env)
    [report] = [json.loads(p.read_text()) for p in out.glob("scores.*.json")]
    [entry] = report["sets"].values()
    return {
        "hypotheses": Path(entry["hypotheses"]).read_text(encoding="utf-8").splitlines(),
        "bleu": entry["scores"]["BLEU"]["score"],
        "seconds": round(entry["seconds"], 2),
    }


def ctranslate2_part(ctx: Context) -> Outcome:
    """A trained Transformer exported with ``--format ctranslate2`` and decoded on the device
    by both engines: the share of identical translations."""
    ct2 = ctx.env["ctranslate2"]
    if not ct2["version"]:
        raise PartSkipped("ctranslate2 is not installed (make gpu-wheels carries its wheel)")
    if ctx.cuda and not ct2["cuda_devices"]:
        raise CheckFailed(f"CTranslate2 {ct2['version']} sees no CUDA device")
    run_dir = next((ctx.runs[n] for n in TRANSFORMER_RUNS if n in ctx.runs), None)
    if run_dir is None:
        run_dir = train(ctx, RunSpec("ctranslate2-train", "transformer", fast_precision(ctx)))
    package = ctx.work / "ctranslate2" / "package"
    cmd = [sys.executable, "-m", "nmt.ship.export", str(run_dir), "--ckpt", "last",
           "--format", "ctranslate2", "--out", str(package), "--force"]  # fmt: skip
    run_logged(ctx, cmd, ctx.work / "ctranslate2" / "export.log")
    torch_out, ct2_out = decode(ctx, package, "torch"), decode(ctx, package, "ctranslate2")
    pairs = list(zip(torch_out.pop("hypotheses"), ct2_out.pop("hypotheses"), strict=True))
    identical = sum(a == b for a, b in pairs) / max(len(pairs), 1)
    figures = {"run_dir": str(run_dir), "sentences": len(pairs), "identical": round(identical, 4),
               "torch": torch_out, "ctranslate2": ct2_out}  # fmt: skip
    summary = (
        f"{identical:.1%} of {len(pairs)} identical; BLEU {ct2_out['bleu']:.2f} vs torch "
        f"{torch_out['bleu']:.2f}; {ct2_out['seconds']:.1f} s vs {torch_out['seconds']:.1f} s"
    )
    if identical < MIN_IDENTICAL:
        raise CheckFailed(f"the engines agree on {identical:.1%} only ({summary})")
    return Outcome(summary, figures)


# ------------------------------------------------------------------------------ DDP

ONE_GPU_NOTE = (
    "one GPU visible: the 2 ranks shared it over gloo (nmt.runtime.distributed.rank_gpu; NCCL "
    "refuses two ranks on one GPU), so NCCL itself was not run"
)


@dataclass(frozen=True)
class DdpPlan:
    """Where the two ranks run: trainer.device, the backend nmt picks there, and the note of
    what the run leaves unchecked (empty when the path itself runs)."""

    device: str
    backend: str
    note: str = ""


def ddp_plan(device: str, gpus: int) -> DdpPlan:
    """NCCL on the GPUs where two are visible; on one GPU, both ranks on it over gloo; gloo on
    the CPU in a CPU check."""
    if device.split(":")[0] != "cuda":
        return DdpPlan("cpu", "gloo")
    if gpus >= 2:
        return DdpPlan("cuda", "nccl")
    return DdpPlan("cuda", "gloo", ONE_GPU_NOTE)


DDP_STEPS = {"cuda": 40, "cpu": 10}  # updates; 8 with --quick


def ddp_part(ctx: Context) -> Outcome:
    """``torch.distributed.run --nproc-per-node=2 -m nmt.train``: both ranks train, rank 0
    alone writes the run's events, the loss decreases."""
    from nmt.train.runlog import of_kind, read_events

    plan = ddp_plan(ctx.s.device, ctx.env["gpus"])
    precision = fast_precision(ctx) if plan.device == "cuda" else "fp32"
    steps = 8 if ctx.s.quick else DDP_STEPS[plan.device]
    extra = [*limits(ctx, steps), f"trainer.device={plan.device}",
             f"trainer.log_every={max(1, steps // 5)}"]  # fmt: skip
    run_dir, outputs = run_folder(ctx, "ddp")
    spec = RunSpec("ddp", "transformer", precision, extra)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
           f"--master-port={free_port()}", "-m", "nmt.train",
           *train_overrides(ctx, spec, run_dir, outputs)]  # fmt: skip
    env = child_env()
    if plan.device == "cpu":
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // 2)))
    run_logged(ctx, cmd, outputs / "console.log", env)
    figures = trained_figures(run_dir, precision)
    starts = len(of_kind(read_events(run_dir), "start"))
    if figures["world_size"] != 2 or starts != 1 or figures["updates"] != steps:
        raise CheckFailed(
            f"world size {figures['world_size']}, {starts} start events (rank 0 alone writes "
            f"one), {figures['updates']} of {steps} updates"
        )
    figures.update(backend=plan.backend, device=plan.device)
    summary = (
        f"2 ranks, {plan.backend} on {plan.device}: {rate_text(figures)}, {loss_text(figures)}"
    )
    return Outcome(summary, figures, plan.note, fallback=bool(plan.note))


# ------------------------------------------------------------------------------ compile

COMPILE_STEPS = {False: 60, True: 6}  # updates by --quick
COMPILED = "done compiler function"  # a graph compiled, as TORCH_LOGS=dynamo reports it


def compile_part(ctx: Context) -> Outcome:
    """``trainer.compile=true`` for a few updates: graphs compiled, tokens/s after
    compiling against the eager run of the same precision, the loss must decrease."""
    precision = fast_precision(ctx)
    steps = COMPILE_STEPS[ctx.s.quick]
    extra = [*limits(ctx, steps), "trainer.compile=true",
             f"trainer.log_every={max(1, steps // 6)}"]  # fmt: skip
    run_dir = train(ctx, RunSpec("compile", "transformer", precision, extra),
                    env=child_env(TORCH_LOGS="dynamo"))  # fmt: skip
    log_text = (run_dir.parent / "console.log").read_text(encoding="utf-8", errors="replace")
    graphs = log_text.count(COMPILED)
    if graphs == 0:
        raise CheckFailed(f"trainer.compile=true compiled no graph ('{COMPILED}' not logged)")
    figures = trained_figures(run_dir, precision, skip=2)  # the first windows compile
    figures["graphs_compiled"] = graphs
    parts = [f"{graphs} graph(s) compiled", rate_text(figures)]
    eager = ctx.figures.get(f"transformer-{precision}", {}).get("tokens_per_s")
    if eager and figures["tokens_per_s"]:
        figures["speedup_over_eager"] = round(figures["tokens_per_s"] / eager, 2)
        parts[-1] += f" ({figures['speedup_over_eager']:.2f}x eager)"
    return Outcome(", ".join([*parts, loss_text(figures), precision]), figures)


# ------------------------------------------------------------------------------ the table


def quality_part(ctx: Context) -> Outcome:
    from benchmarks.gpu_check_quality import quality

    return quality(ctx)


def short_run(s: GpuCheckSettings) -> float:
    """A short training run's budget: its training time and a minute for the rest."""
    return (5 if s.quick else s.run_seconds) + 60


def precision_parts() -> list[Part]:
    return [
        Part(
            f"{model}-{precision}", f"{MODEL_NAMES[model]} trained in {precision}",
            partial(precision_part, model=model, precision=precision), short_run,
            groups=("precision", model),
        )
        for model in MODELS
        for precision in PRECISIONS
    ]  # fmt: skip


PARTS: tuple[Part, ...] = (
    *precision_parts(),
    Part("resume", "SIGKILL after a checkpoint, trainer.resume=auto", resume_part,
         lambda s: 150),
    Part("ctranslate2", "export --format ctranslate2, both engines decode the test set",
         ctranslate2_part, lambda s: 120),
    Part("ddp", "torchrun --nproc-per-node=2", ddp_part, lambda s: 120),
    Part("compile", "trainer.compile=true", compile_part, lambda s: 240),
    Part("quality", f"the {MODEL_NAMES['transformer']} preset trained for --train-seconds, "
         "bench and test BLEU", quality_part, lambda s: s.train_seconds + 300, default=False),
)  # fmt: skip

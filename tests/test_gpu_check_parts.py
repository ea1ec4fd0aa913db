"""The parts of the GPU check (benchmarks.gpu_check, gpu_check_env, gpu_check_parts,
gpu_check_runs, gpu_check_report) on CPU.

The check's bookkeeping is checked directly: which parts run, a part's failure, skip, fallback
or overrun leaving the others to run, the total budget, the PyTorch floor read without
importing nmt, the DDP plan for one or two GPUs, bf16 skipped on a GPU that only emulates it,
the printed table. Slow tests run every part through scripts/gpu_check.sh in ``--device cpu
--quick`` mode with tiny models on a small real Multi30k subset.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import gpu_check as gc
from benchmarks import gpu_check_env as genv
from benchmarks import gpu_check_parts as gp
from benchmarks.gpu_check_report import report
from benchmarks.gpu_check_runs import loss_decreased, run_logged

from .helpers import corpus_overrides

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def context(tmp_path: Path, **env: object) -> gc.Context:
    settings = gc.GpuCheckSettings(repo=REPO, out=tmp_path / "out.json", device="cpu")
    facts = {"device_type": "cpu", "gpus": 0, "capability": None, **env}
    return gc.Context(settings, tmp_path / "work", facts)


def outcome(text: str) -> gc.Outcome:
    return gc.Outcome(text, {"figure": 1})


def part(name: str, run, budget: float = 60) -> gc.Part:
    return gc.Part(name, f"the part {name}", run, lambda s: budget)


# ------------------------------------------------------------------------------ bookkeeping


def test_parts_are_selected_by_name_or_group():
    names = [p.name for p in gc.select_parts(gp.PARTS, "")]
    assert "quality" not in names and {"resume", "ctranslate2", "ddp", "compile"} <= set(names)
    assert len([n for n in names if n.split("-")[-1] in ("bf16", "fp16", "fp32")]) == 6
    picked = [p.name for p in gc.select_parts(gp.PARTS, "resume, gru")]
    assert picked == ["gru-bf16", "gru-fp16", "gru-fp32", "resume"]
    assert [p.name for p in gc.select_parts(gp.PARTS, "all")][-1] == "quality"
    groups = "the groups: all, gru, precision, transformer$"
    with pytest.raises(gc.CheckFailed, match=f"no part or group nccl.*{groups}"):
        gc.select_parts(gp.PARTS, "nccl")


def test_a_failing_skipped_or_overrunning_part_leaves_the_others_to_run(tmp_path):
    ctx = context(tmp_path)
    pid_file = tmp_path / "grandchild.pid"

    def overrun(c: gc.Context) -> gc.Outcome:  # a command whose child outlives the deadline
        run_logged(c, ["bash", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], tmp_path / "l")
        return outcome("never")

    def fails(c: gc.Context) -> gc.Outcome:
        raise RuntimeError("broken\nits log")

    def skips(c: gc.Context) -> gc.Outcome:
        raise gc.PartSkipped("needs CUDA")

    parts = [
        part("fails", fails), part("overrun", overrun, budget=1.5), part("skips", skips),
        part("fallback", lambda c: gc.Outcome("ran elsewhere", note="why", fallback=True)),
        part("passes", lambda c: outcome("fine")),
    ]  # fmt: skip
    tic = time.monotonic()
    rows = {r["part"]: r for r in gc.run_parts(parts, ctx, budget=120)}
    assert time.monotonic() - tic < 10
    assert [r["status"] for r in rows.values()] == [
        "failed", "failed", "skipped", "fallback", "passed"
    ]  # fmt: skip
    assert rows["fails"]["note"] == "broken\nits log" and "RuntimeError" in rows["fails"]["error"]
    assert "deadline" in rows["overrun"]["note"] and rows["overrun"]["seconds"] < 5
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # the whole process group was killed, not only the command
        if not Path(f"/proc/{grandchild}").exists() or "Z" in stat_state(grandchild):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"process {grandchild} of the overrun command still runs")
    assert rows["skips"]["note"] == "needs CUDA"
    assert rows["fallback"]["summary"] == "ran elsewhere" and rows["fallback"]["note"] == "why"
    assert rows["passes"]["figures"] == {"figure": 1} and ctx.figures["passes"] == {"figure": 1}


def stat_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_parts_beyond_the_total_budget_are_skipped(tmp_path):
    ctx = context(tmp_path)

    def slow(c: gc.Context) -> gc.Outcome:
        time.sleep(1.0)
        return outcome("slow")

    parts = [part("first", slow), part("second", lambda c: outcome("never"))]
    rows = gc.run_parts(parts, ctx, budget=gc.MIN_PART_SECONDS + 0.5)
    assert [r["status"] for r in rows] == ["passed", "skipped"]
    assert rows[1]["note"] == "no time left in the check's budget"


def test_the_torch_floor_is_read_without_importing_nmt(tmp_path):
    (tmp_path / "nmt").mkdir()
    (tmp_path / "nmt" / "__init__.py").write_text("import torch\nTORCH_FLOOR = (2, 4)\n")
    (tmp_path / "pyproject.toml").write_text('dependencies = [\n    "torch>=2.3,<3",\n]\n')
    floor = genv.torch_floor(tmp_path)
    assert floor == {"floor": "2.4", "source": "nmt.TORCH_FLOOR", "constant": "2.4",
                     "requirement": "2.3", "agree": False}  # fmt: skip
    (tmp_path / "nmt" / "__init__.py").write_text('"""No floor here."""\n')
    assert genv.torch_floor(tmp_path)["floor"] == "2.3"
    assert genv.torch_floor(tmp_path)["source"] == "pyproject.toml"
    # this checkout: the floor the package enforces when it is imported
    import nmt

    here = genv.torch_floor(REPO)
    expected = getattr(nmt, "TORCH_FLOOR", None)
    if expected is not None:
        assert here["floor"] == ".".join(map(str, expected)) and here["agree"]
    assert here["floor"] is not None
    assert not genv.torch_meets("2.3.1+cu121", "2.4")
    assert genv.torch_meets("2.4.0a0+git1a2b3c", "2.4") and genv.torch_meets("2.13.0+cpu", "2.4")


def test_a_torch_below_the_floor_stops_the_check_before_any_part(tmp_path):
    repo = tmp_path / "repo"
    (repo / "nmt").mkdir(parents=True)
    (repo / "nmt" / "__init__.py").write_text("TORCH_FLOOR = (99, 0)\n")
    s = gc.GpuCheckSettings(repo=repo, out=tmp_path / "out.json", device="cpu")
    ran = []
    parts = [part("a", lambda c: ran.append("a") or outcome("a"))]
    lines: list[str] = []
    result = gc.run_check(s, announce=lines.append, parts=parts)
    assert ran == [] and result["passed"] is False
    assert [p["status"] for p in result["parts"]] == ["skipped"]
    assert "older than nmt's floor 99.0" in result["parts"][0]["note"]
    assert lines[0].startswith("torch ") and "TOO OLD" in lines[0]
    assert any("problem: torch" in line for line in lines)


def test_ddp_runs_nccl_on_two_gpus_and_shares_one_over_gloo():
    assert gp.ddp_plan("cpu", 0) == gp.DdpPlan("cpu", "gloo")
    assert gp.ddp_plan("cuda", 2) == gp.DdpPlan("cuda", "nccl")
    one = gp.ddp_plan("cuda:0", 1)
    assert (one.device, one.backend) == ("cuda", "gloo") and "NCCL itself was not run" in one.note


def test_the_gru_encoder_must_run_in_the_autocast_dtype_on_a_gpu(tmp_path, monkeypatch):
    """cuDNN's RNN under bf16 autocast in fp16 would train without loss scaling: on a GPU the
    check fails then; on the CPU it reports the dtype it measured."""
    cpu = context(tmp_path)
    assert gp.checked_gru_dtype(cpu, "bf16") in ("bfloat16", "float32")  # as CPU autocast has it
    gpu = context(tmp_path, device_type="cuda", gpus=1, capability=[9, 0], native_bf16=True)
    monkeypatch.setattr(gp, "gru_kernel_dtype", lambda device, precision: "float16")
    assert gp.checked_gru_dtype(gpu, "fp16") == "float16"
    with pytest.raises(gc.CheckFailed, match="under bf16 autocast the GRU encoder ran in float16"):
        gp.checked_gru_dtype(gpu, "bf16")


def test_bf16_is_skipped_on_a_gpu_that_only_emulates_it(tmp_path):
    ctx = context(tmp_path, device_type="cuda", gpus=1, capability=[7, 0], native_bf16=False)
    [bf16] = gc.select_parts(gp.PARTS, "transformer-bf16")
    [row] = gc.run_parts([bf16], ctx, budget=60)
    assert row["status"] == "skipped"
    assert (
        row["note"] == "bf16 training needs compute capability 8.0 (this GPU: 7.0, bf16 emulated)"
    )
    assert not ctx.work.exists()  # nothing ran
    ctx.env.update(device_type="cpu", capability=None)  # compile in fp32 there, fp16 on a V100
    assert gp.fast_precision(ctx) == "fp32"


def test_fp16_that_fails_on_the_cpu_is_skipped_as_needing_cuda(tmp_path, monkeypatch):
    def failing(ctx, spec, env=None):
        raise gc.CheckFailed("exit status 1: console.log ends\nRuntimeError: no fp16 here")

    monkeypatch.setattr(gp, "train", failing)
    parts = gc.select_parts(gp.PARTS, "transformer-fp16,transformer-fp32")
    rows = gc.run_parts(parts, context(tmp_path), budget=60)
    assert [r["status"] for r in rows] == ["skipped", "failed"]
    assert (
        rows[0]["note"]
        == "needs CUDA: fp16 training failed on the CPU (exit status 1: console.log ends)"
    )
    ctx = context(tmp_path, device_type="cuda", gpus=1, capability=[9, 0], native_bf16=True)
    [row] = gc.run_parts(parts[:1], ctx, budget=60)  # on a GPU it is a failure
    assert row["status"] == "failed"


def test_the_loss_must_fall_over_at_least_two_windows():
    assert loss_decreased({"losses": [7.0, 6.5, 6.0], "updates": 30})
    assert not loss_decreased({"losses": [6.0, 6.2], "updates": 20})
    with pytest.raises(gc.CheckFailed, match="1 log window"):
        loss_decreased({"losses": [6.0], "updates": 10})


def test_the_report_is_a_table_with_the_notes_below():
    env = {"torch": "2.6.0", "python": "3.12.3", "device": "cuda", "device_name": "NVIDIA H100",
           "torch_ok": True, "capability": [9, 0], "native_bf16": True, "gpus": 1,
           "memory_gib": 79.1, "cuda": "12.4", "cudnn": 90100, "nccl": "2.21.5",
           "triton": True, "problems": [], "ctranslate2": {"version": None},
           "torch_floor": {"floor": "2.4", "constant": "2.4", "requirement": "2.4",
                           "agree": True, "source": "nmt.TORCH_FLOOR"}}  # fmt: skip
    parts = [
        gc.row("transformer-bf16", "passed", 31.0, summary="90,000 tok/s, loss 9.1 -> 5.2"),
        gc.row("ddp", "fallback", 25.0, summary="2 ranks, gloo on cpu", note="one GPU visible"),
        gc.row("compile", "failed", 12.0, note="exit status 1: console.log ends\nTraceback"),
    ]
    text = report({"environment": env, "parts": parts, "seconds": 68.0})
    lines = text.splitlines()
    assert lines[0].startswith("torch 2.6.0 (python 3.12.3); nmt's floor 2.4") and "ok" in lines[0]
    assert "compute capability 9.0 (native bf16 and TF32)" in lines[1]
    assert "GPU check on NVIDIA H100: 1 passed, 1 fallback, 1 failed, 0 skipped in 68 s" in text
    header = next(i for i, line in enumerate(lines) if line.startswith("part "))
    assert [c.strip() for c in lines[header].split(" | ")] == [
        "part", "status", "figures", "seconds"
    ]  # fmt: skip
    assert lines[header + 2].startswith("transformer-bf16 | passed   | 90,000 tok/s")
    assert lines[header + 3].startswith("ddp              | fallback | 2 ranks, gloo on cpu")
    assert lines[header + 4].startswith("compile          | failed   | exit status 1")
    assert lines[header + 4].endswith("|      12")
    assert "  ddp (fallback): one GPU visible" in lines
    assert "  compile (failed): exit status 1: console.log ends" in lines
    assert "    Traceback" in lines


# ------------------------------------------------------------------------------ on the CPU


def check_on_cpu(corpus: Path, tmp_path: Path, parts: str) -> tuple[str, dict]:
    """``gpu_check.sh --device cpu --quick --parts PARTS`` on the small corpus, one thread;
    its standard output and JSON."""
    overrides = [*corpus_overrides(corpus, tmp_path), "trainer.threads=1"]
    out = tmp_path / "check.json"
    args = ["--device", "cpu", "--quick", "--parts", parts, "--out", str(out)]
    args += ["--work", str(tmp_path / "work")] + [a for o in overrides for a in ("--override", o)]
    env = {**os.environ, "PYTHON": sys.executable, "NMT_GPU_SITE": str(tmp_path / "site"),
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # fmt: skip
    proc = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["schema"] == gc.SCHEMA and result["passed"] is True
    assert proc.stdout.startswith("torch ")  # the version comes first
    return proc.stdout, {p["part"]: p for p in result["parts"]}


@pytest.mark.slow(seconds=28)
def test_each_model_and_each_precision_trains_on_cpu(corpus, tmp_path):
    """Every precision's path and both models, in three of the six runs (a GPU runs all six)."""
    stdout, parts = check_on_cpu(corpus, tmp_path, "transformer-bf16,gru-fp16,transformer-fp32")
    assert len(parts) == 3 and {p["status"] for p in parts.values()} == {"passed"}
    for name, p in parts.items():
        f = p["figures"]
        precision = {"bf16": "bf16", "fp16": "16", "fp32": "32"}[name.split("-")[1]]
        assert f["precision"] == precision and f["updates"] == 16 and f["tokens_per_s"] > 0
        assert f["losses"][-1] < f["losses"][0] and len(f["losses"]) == 8
        assert (f.get("loss_scale", 0) > 0) == (precision == "16")
        assert re.search(rf"^{name} +\| passed +\| [0-9,]+ tok/s", stdout, re.M), stdout


@pytest.mark.slow(seconds=55)
def test_a_killed_run_resumes_and_ctranslate2_agrees_with_torch_on_cpu(corpus, tmp_path):
    _, parts = check_on_cpu(corpus, tmp_path, "resume,ctranslate2")
    resume, ct2 = parts["resume"], parts["ctranslate2"]
    assert resume["status"] == "passed", resume["note"]
    f = resume["figures"]
    assert f["killed_after"] == "step_00000004.pt" and f["resumed_at"] == 4
    assert f["final_step"] == 12 and f["differs"] == [] and f["max_abs_weight_diff"] == 0.0
    assert "bit-identical" in resume["summary"]
    assert ct2["status"] == "passed", ct2["note"]
    assert ct2["figures"]["identical"] == 1.0 and ct2["figures"]["sentences"] == 120
    assert ct2["figures"]["run_dir"].endswith("ctranslate2-train/run")  # no precision part ran


@pytest.mark.slow(seconds=20)
def test_two_ranks_train_under_torchrun_on_cpu(corpus, tmp_path):
    _, parts = check_on_cpu(corpus, tmp_path, "ddp")
    ddp = parts["ddp"]
    assert ddp["status"] == "passed" and ddp["note"] == ""  # the path itself, no fallback
    f = ddp["figures"]
    assert (f["backend"], f["device"], f["world_size"], f["updates"]) == ("gloo", "cpu", 2, 8)

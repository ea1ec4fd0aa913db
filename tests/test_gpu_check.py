"""The GPU check (benchmarks.gpu_check, gpu_wheels, gpu_check_quality; scripts/gpu_check.sh,
gpu_check.py) on CPU: everything but the GPU.

The wheel selection and offline install, the corpus check, the reading of a run's events and
the preset are checked directly; one slow test runs the quality part through gpu_check.sh with
a tiny model on a small real Multi30k subset for a few seconds of training. The other parts:
tests/test_gpu_check_parts.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from benchmarks import gpu_check as gc
from benchmarks import gpu_wheels
from benchmarks.gpu_check_quality import run_history
from nmt.config_checks import check_train_config
from nmt.train.runlog import RunLog, read_events

from .helpers import TINY_TRANSFORMER, compose_config, corpus_overrides, write_subset

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def fake_wheel(directory: Path, dist: str, module: str, version: str = "1.0") -> Path:
    """A minimal valid pure-Python wheel holding ``module/__init__.py``."""
    name = gpu_wheels.normalize(dist)
    path = directory / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}/__init__.py", f"NAME = {dist!r}\n")
        z.writestr(f"{name}-{version}.data/purelib/{module}_extra.py", "X = 1\n")
        z.writestr(f"{name}-{version}.data/scripts/tool", "#!/bin/sh\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        z.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{info}/RECORD", "")
    return path


def python_without_site(tmp_path: Path) -> Path:
    """An interpreter that sees only the standard library (and PYTHONPATH): no hydra, no pip."""
    wrapper = tmp_path / "bin" / "python-bare"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def run_script(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ------------------------------------------------------------------------------ wheels


def test_wheels_needed_selects_the_missing_packages(tmp_path):
    for module, dist in gpu_wheels.WHEEL_PACKAGES.items():
        fake_wheel(tmp_path, dist, module)
    lacking = {"hydra", "omegaconf", "PIL"}
    found, absent = gpu_wheels.wheels_needed(tmp_path, present=lambda m: m not in lacking)
    assert absent == []
    assert sorted(p.name.split("-")[0] for p in found) == ["hydra_core", "omegaconf", "pillow"]
    found, absent = gpu_wheels.wheels_needed(tmp_path, present=lambda m: True)
    assert found == [] and absent == []


def test_wheels_needed_names_what_the_folder_lacks(tmp_path):
    fake_wheel(tmp_path, "hydra-core", "hydra")
    found, absent = gpu_wheels.wheels_needed(tmp_path, present=lambda m: m not in {"hydra", "yaml"})
    assert [p.name for p in found] == ["hydra_core-1.0-py3-none-any.whl"]
    assert absent == ["PyYAML"]
    _, absent = gpu_wheels.wheels_needed(tmp_path / "nowhere", present=lambda m: m != "omegaconf")
    assert absent == ["omegaconf"]
    msg = gpu_wheels.missing_wheels_message(tmp_path / "nowhere", absent)
    assert "omegaconf" in msg and "make gpu-wheels" in msg and "is absent" in msg


def test_wrong_python_flags_wheels_for_another_cpython():
    wheels = [
        Path("matplotlib-3.11.2-cp312-cp312-manylinux2014_x86_64.whl"),
        Path("tzdata-2026.6-py2.py3-none-any.whl"),
        Path("hydra_core-1.3.8-py3-none-any.whl"),
    ]
    assert gpu_wheels.wrong_python(wheels, (3, 12)) == []
    assert gpu_wheels.wrong_python(wheels, (3, 11)) == wheels[:1]


def test_unpack_wheel_installs_like_a_target_install(tmp_path):
    wheel = fake_wheel(tmp_path, "omegaconf", "omegaconf")
    site = tmp_path / "site"
    gpu_wheels.unpack_wheel(wheel, site)
    assert (site / "omegaconf" / "__init__.py").read_text() == "NAME = 'omegaconf'\n"
    assert (site / "omegaconf_extra.py").is_file()  # .data/purelib goes to the top
    assert (site / "omegaconf-1.0.dist-info" / "METADATA").is_file()
    assert not (site / "tool").exists()  # scripts are not installed


def test_an_optional_wheel_is_installed_where_it_is_there(tmp_path):
    for module, dist in gpu_wheels.WHEEL_PACKAGES.items():
        fake_wheel(tmp_path, dist, module)
    optional = tmp_path / gpu_wheels.OPTIONAL_DIR
    optional.mkdir()
    ct2 = fake_wheel(optional, "ctranslate2", "ctranslate2")
    lacking = {"hydra", "ctranslate2"}
    assert gpu_wheels.optional_wheels(tmp_path, present=lambda m: m not in lacking) == [ct2]
    assert gpu_wheels.optional_wheels(tmp_path, present=lambda m: True) == []
    ct2.unlink()  # without its wheel the check installs the rest; its part is skipped
    assert gpu_wheels.optional_wheels(tmp_path, present=lambda m: m not in lacking) == []
    found, absent = gpu_wheels.wheels_needed(tmp_path, present=lambda m: m not in lacking)
    assert [p.name.split("-")[0] for p in found] == ["hydra_core"] and absent == []


def test_fetched_wheels_are_complete():
    """After `make gpu-wheels`: one wheel per package, and under 30 MB in all."""
    wheel_dir = REPO / gpu_wheels.WHEELS_DIR
    if not any(wheel_dir.glob("*.whl")):
        pytest.skip(f"no wheels in {wheel_dir} (make gpu-wheels)")
    found, absent = gpu_wheels.wheels_needed(wheel_dir, present=lambda m: False)
    assert absent == []
    assert len(found) == len(gpu_wheels.WHEEL_PACKAGES)
    assert sum(p.stat().st_size for p in wheel_dir.glob("*.whl")) < 30e6


# ------------------------------------------------------------------------------ gpu_check.sh


def test_the_check_loads_without_nmt_or_torch():
    """The wheel helpers and the first step run before anything else: importing nmt (which
    refuses a PyTorch below its floor) or torch would stop them."""
    modules = ["benchmarks.gpu_check", "benchmarks.gpu_check_env", "benchmarks.gpu_check_parts",
               "benchmarks.gpu_check_runs", "benchmarks.gpu_check_quality",
               "benchmarks.gpu_check_report", "benchmarks.gpu_wheels"]  # fmt: skip
    code = (
        f"import sys, importlib; [importlib.import_module(m) for m in {modules!r}]; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('nmt', 'torch')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_script_without_wheels_or_hydra_says_what_to_do(tmp_path):
    result = run_script(
        ["--device", "cpu"],
        {
            "PYTHON": str(python_without_site(tmp_path)),
            "NMT_GPU_WHEELS": str(tmp_path / "no-wheels"),
            "NMT_GPU_SITE": str(tmp_path / "site"),
        },
        timeout=60,
    )
    assert result.returncode == 3, result.stderr
    assert "hydra-core" in result.stderr and "omegaconf" in result.stderr
    assert "make gpu-wheels" in result.stderr
    assert str(tmp_path / "no-wheels") in result.stderr
    assert not (tmp_path / "site").exists()


def test_script_installs_missing_wheels_offline_then_needs_torch(tmp_path):
    """A bare Python: every package comes from the wheel folder (unpacked: no pip there),
    then the check stops because that Python has no torch."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for module, dist in gpu_wheels.WHEEL_PACKAGES.items():
        fake_wheel(wheels, dist, module)
    site = tmp_path / "site"
    env = {
        "PYTHON": str(python_without_site(tmp_path)),
        "NMT_GPU_WHEELS": str(wheels),
        "NMT_GPU_SITE": str(site),
    }
    result = run_script(["--device", "cpu"], env, timeout=60)
    assert result.returncode == 4, result.stderr
    assert f"installing {len(gpu_wheels.WHEEL_PACKAGES)} wheels" in result.stderr
    assert "cannot import torch" in result.stderr
    for module in gpu_wheels.WHEEL_PACKAGES:
        assert (site / module / "__init__.py").is_file()
    again = run_script(["--device", "cpu"], env, timeout=60)  # now present: nothing to install
    assert again.returncode == 4 and "installing" not in again.stderr


# ------------------------------------------------------------------------------ pieces


def test_corpus_problem_names_both_places(tmp_path):
    root, mirror = tmp_path / "data", tmp_path / "mirror"
    msg = gc.corpus_problem(root, None)
    assert "NMT_MULTI30K_MIRROR is not set" in msg and str(root / "multi30k") in msg
    msg = gc.corpus_problem(root, str(mirror))
    assert f"NMT_MULTI30K_MIRROR={mirror}" in msg and "train.de.gz" in msg
    mirror.mkdir()
    for name in gc.MULTI30K_FILES:
        (mirror / name).write_bytes(b"")
    assert gc.corpus_problem(root, str(mirror)) is None
    (root / "multi30k").mkdir(parents=True)
    for name in gc.MULTI30K_FILES:
        (root / "multi30k" / name).write_bytes(b"")
    assert gc.corpus_problem(root, None) is None


def test_check_without_corpus_names_both_places(tmp_path, monkeypatch):
    monkeypatch.delenv("NMT_MULTI30K_MIRROR", raising=False)
    s = gc.GpuCheckSettings(repo=tmp_path, out=tmp_path / "out.json", device="cpu")
    with pytest.raises(gc.CheckFailed) as failed:
        gc.run_check(s)
    err = str(failed.value)
    assert "Multi30k not found" in err and "NMT_MULTI30K_MIRROR is not set" in err
    assert "data/multi30k" in err
    assert not (tmp_path / "out.json").exists() and not list(tmp_path.iterdir())


def test_overrides_helpers():
    assert gc.uses_multi30k(["model.d_model=64", "data=multi30k_en_de"])
    assert not gc.uses_multi30k(["data=parallel"])
    assert not gc.uses_multi30k(["data.corpus=parallel"])
    merged = gc.with_defaults(["a=1", "b=2", "c.d=3"], ["b=5", "+e=1", "c.d=4"])
    assert merged == ["a=1", "b=5", "+e=1", "c.d=4"]


def test_run_history_reads_bleu_over_time_and_tokens_per_second(tmp_path, monkeypatch):
    """From a run's events: validation BLEU against the seconds since the process started and
    since training began, the windows' tokens/s (the first left out), epochs, averaging."""
    clock = iter(float(t) for t in range(1011, 1020))
    monkeypatch.setattr("nmt.train.runlog.time.time", lambda: next(clock))
    log = RunLog(tmp_path)
    log.write("start", 0, device="Some GPU", device_type="cuda", parameters=7578624,
              train_pairs=28997, batches_per_epoch=34)  # fmt: skip
    window = {"grad_norm": 1.0, "tokens": 9000, "updates": 100, "seconds": 0.1, "train_time": 1.0}
    log.write("train", 100, epoch=3, loss=5.123, lr=5e-4, tokens_per_s=90000.0, **window)
    log.write("train", 200, epoch=6, loss=4.0, lr=1e-3, tokens_per_s=100000.0, **window)
    log.write("validation", 200, loss=3.21, ppl=24.78, bleu=20.5, chrf=45.1, seconds=1.2,
              best=True)  # fmt: skip
    log.write("checkpoint", 200, path="checkpoints/best.pt", best=True)
    log.write("train", 300, epoch=7, loss=3.5, lr=9e-4, tokens_per_s=110000.0, **window)
    log.write("averaged", 300, checkpoints=["step_00000100", "step_00000200"], path="x.pt",
              loss=2.0, ppl=7.4, bleu=21.0, chrf=46.0)  # fmt: skip
    log.write("end", 300, epoch=7, train_time=3.0, stop_reason="max_steps", best_bleu=20.5,
              best_step=200)  # fmt: skip
    h = run_history(read_events(tmp_path), started=1000.0)
    assert h["model"] == {"parameters": 7578624, "device": "cuda"}
    assert (h["train_pairs"], h["batches_per_epoch"], h["train_start_wall_s"]) == (28997, 34, 11.0)
    [v] = h["validation_history"]
    assert (v["step"], v["bleu"], v["chrf"], v["seconds"]) == (200, 20.5, 45.1, 1.2)
    assert (v["wall_s"], v["since_train_start_s"]) == (14.0, 3.0)
    assert h["validation_seconds_total"] == 1.2
    assert h["tgt_tokens_per_s"] == {"median": 105000.0, "mean": 105000.0, "n": 2}
    assert [w["tgt_tokens_per_s"] for w in h["log_windows"]] == [90000.0, 100000.0, 110000.0]
    assert h["averaged"]["bleu"] == 21.0 and h["averaged"]["checkpoints"] == [
        "step_00000100",
        "step_00000200",
    ]
    assert h["averaged"]["wall_s"] == 17.0
    # an epoch ends with the last window logged in it
    assert h["epochs"] == [
        {"epoch": 3, "step": 100, "wall_s": 12.0},
        {"epoch": 6, "step": 200, "wall_s": 13.0},
    ]
    empty = run_history([], started=0.0)
    assert empty["validation_history"] == [] and empty["tgt_tokens_per_s"] is None


def test_gpu_quick_preset():
    cfg = compose_config("train", ["experiment=gpu_quick"])
    check_train_config(cfg)
    assert cfg.model.d_model == 256 and cfg.model.enc_layers == 3  # the default architecture
    assert str(cfg.trainer.precision) == "bf16"
    assert cfg.trainer.max_time == 180 and cfg.optim.decay_over == "time"
    assert cfg.optim.schedule == "linear" and cfg.trainer.patience == 0
    assert cfg.trainer.val_sentences == 0 and cfg.trainer.average_last == 5
    assert (cfg.decode.beam, cfg.decode.checkpoint) == (5, "auto")
    assert cfg.data.max_tokens >= 12000


# ------------------------------------------------------------------------------ the quality part


@pytest.mark.slow(seconds=28)
def test_quality_part_on_cpu(tmp_path, multi30k):
    corpus = write_subset(multi30k, tmp_path / "corpus", "train", 200)
    overrides = [
        *corpus_overrides(corpus, tmp_path),
        *TINY_TRANSFORMER,
        "data.max_tokens=600",
        "trainer.precision=32",
        "trainer.threads=1",
        "trainer.val_every=5",
        "trainer.log_every=2",
        "optim.warmup_steps=30",
    ]
    out = tmp_path / "check" / "gpu_check.json"
    args = ["--device", "cpu", "--parts", "quality", "--train-seconds", "6", "--bench-steps", "2"]
    args += ["--bench-warmup", "1", "--out", str(out)]
    args += [a for o in overrides for a in ("--override", o)]
    env = {"PYTHON": sys.executable, "NMT_GPU_SITE": str(tmp_path / "site")}
    result = run_script(args, {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, 300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "validation BLEU over time" in result.stdout and "MFU" in result.stdout
    [part] = json.loads(out.read_text())["parts"]
    assert (part["part"], part["status"]) == ("quality", "passed"), part["note"]
    r = part["figures"]
    train = r["training"]
    assert train["summary"]["stop_reason"].startswith("reached the time limit")
    assert train["tgt_tokens_per_s"]["median"] > 0
    history = train["validation_history"]
    assert history and all(v["bleu"] >= 0 and v["since_train_start_s"] >= 0 for v in history)
    assert [v["step"] for v in history] == sorted(v["step"] for v in history)
    assert train["averaged"] is not None
    assert r["peak"]["tflops"] > 0 and r["precision"] == "32"
    assert r["bench"]["tgt_tokens_per_s"] > 0 and r["bench"]["mfu"] > 0
    assert r["train_mfu"] > 0
    [test] = r["test"].values()
    assert test["bleu"] >= 0 and test["sentences"] == 200
    summary = train["summary"]  # auto: the averaged weights only if they validated better
    better = summary["averaged_bleu"] > summary["best_bleu"]
    assert Path(r["evaluation"]["checkpoint"]).name == ("averaged.pt" if better else "best.pt")
    assert r["evaluation"]["options"]["beam"] == 5
    assert r["goal"]["test_bleu"] == test["bleu"] and r["goal"]["met"] is False
    assert "goal 40: not met" in part["summary"]

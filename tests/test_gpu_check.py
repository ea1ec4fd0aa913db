"""The GPU check (scripts/gpu_check.sh, scripts/gpu_check.py) on CPU: everything but the GPU.

The wheel selection and offline install, the corpus check, the log reading and the preset are
checked directly; one slow test runs the whole check through gpu_check.sh with a tiny model on
a small real Multi30k subset for a few seconds of training.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from nmt.config import validate

from .helpers import TINY_TRANSFORMER, compose_config, corpus_overrides, write_subset

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def _load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gc = _load_gpu_check()


def fake_wheel(directory: Path, dist: str, module: str, version: str = "1.0") -> Path:
    """A minimal valid pure-Python wheel holding ``module/__init__.py``."""
    name = gc.normalize(dist)
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
    for module, dist in gc.WHEEL_PACKAGES.items():
        fake_wheel(tmp_path, dist, module)
    lacking = {"hydra", "omegaconf", "PIL"}
    found, absent = gc.wheels_needed(tmp_path, present=lambda m: m not in lacking)
    assert absent == []
    assert sorted(p.name.split("-")[0] for p in found) == ["hydra_core", "omegaconf", "pillow"]
    found, absent = gc.wheels_needed(tmp_path, present=lambda m: True)
    assert found == [] and absent == []


def test_wheels_needed_names_what_the_folder_lacks(tmp_path):
    fake_wheel(tmp_path, "hydra-core", "hydra")
    found, absent = gc.wheels_needed(tmp_path, present=lambda m: m not in {"hydra", "yaml"})
    assert [p.name for p in found] == ["hydra_core-1.0-py3-none-any.whl"]
    assert absent == ["PyYAML"]
    _, absent = gc.wheels_needed(tmp_path / "nowhere", present=lambda m: m != "omegaconf")
    assert absent == ["omegaconf"]
    msg = gc.missing_wheels_message(tmp_path / "nowhere", absent)
    assert "omegaconf" in msg and "make gpu-wheels" in msg and "is absent" in msg


def test_wrong_python_flags_wheels_for_another_cpython():
    wheels = [
        Path("matplotlib-3.11.2-cp312-cp312-manylinux2014_x86_64.whl"),
        Path("tzdata-2026.6-py2.py3-none-any.whl"),
        Path("hydra_core-1.3.8-py3-none-any.whl"),
    ]
    assert gc.wrong_python(wheels, (3, 12)) == []
    assert gc.wrong_python(wheels, (3, 11)) == wheels[:1]


def test_unpack_wheel_installs_like_a_target_install(tmp_path):
    wheel = fake_wheel(tmp_path, "omegaconf", "omegaconf")
    site = tmp_path / "site"
    assert gc.main(["unpack-wheels", str(site), str(wheel)]) == 0
    assert (site / "omegaconf" / "__init__.py").read_text() == "NAME = 'omegaconf'\n"
    assert (site / "omegaconf_extra.py").is_file()  # .data/purelib goes to the top
    assert (site / "omegaconf-1.0.dist-info" / "METADATA").is_file()
    assert not (site / "tool").exists()  # scripts are not installed


def test_fetched_wheels_are_complete():
    """After `make gpu-wheels`: one wheel per package, and under 30 MB in all."""
    wheel_dir = gc.DEFAULT_WHEELS
    if not any(wheel_dir.glob("*.whl")):
        pytest.skip(f"no wheels in {wheel_dir} (make gpu-wheels)")
    found, absent = gc.wheels_needed(wheel_dir, present=lambda m: False)
    assert absent == []
    assert len(found) == len(gc.WHEEL_PACKAGES)
    assert sum(p.stat().st_size for p in wheel_dir.glob("*.whl")) < 30e6


# ------------------------------------------------------------------------------ gpu_check.sh


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
    for module, dist in gc.WHEEL_PACKAGES.items():
        fake_wheel(wheels, dist, module)
    site = tmp_path / "site"
    env = {
        "PYTHON": str(python_without_site(tmp_path)),
        "NMT_GPU_WHEELS": str(wheels),
        "NMT_GPU_SITE": str(site),
    }
    result = run_script(["--device", "cpu"], env, timeout=60)
    assert result.returncode == 4, result.stderr
    assert f"installing {len(gc.WHEEL_PACKAGES)} wheels" in result.stderr
    assert "cannot import torch" in result.stderr
    for module in gc.WHEEL_PACKAGES:
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


def test_check_without_corpus_names_both_places(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gc, "REPO", tmp_path)
    monkeypatch.setattr(sys, "path", [*sys.path])
    monkeypatch.delenv("NMT_MULTI30K_MIRROR", raising=False)
    assert gc.main(["--device", "cpu", "--out", str(tmp_path / "out.json")]) == 1
    err = capsys.readouterr().err
    assert "Multi30k not found" in err and "NMT_MULTI30K_MIRROR is not set" in err
    assert "data/multi30k" in err
    assert not (tmp_path / "out.json").exists()


def test_overrides_helpers():
    assert gc.uses_multi30k(["model.d_model=64", "data=multi30k_en_de"])
    assert not gc.uses_multi30k(["data=parallel"])
    assert not gc.uses_multi30k(["data.corpus=parallel"])
    merged = gc.with_defaults(["a=1", "b=2", "c.d=3"], ["b=5", "+e=1", "c.d=4"])
    assert merged == ["a=1", "b=5", "+e=1", "c.d=4"]


def test_log_follower_reads_bleu_over_time_and_tokens_per_second():
    lines = [
        "[10:00:00 INFO nmt.train] model Transformer: 7,578,624 parameters on cuda",
        "[10:00:01 INFO nmt.train] training data: 28997 pairs, 34 batches per epoch per rank, "
        "padding share 7.2%",
        "[10:00:02 INFO nmt.train] step 100: loss 5.123, lr 5.00e-04, 90000 target tokens/s, "
        "grad norm 1.20",
        "[10:00:03 INFO nmt.train] step 200: loss 4.000, lr 1.00e-03, 100000 target tokens/s, "
        "grad norm 1.00",
        "[10:00:04 INFO nmt.train] validation at step 200: loss 3.210 ppl 24.78 BLEU 20.50 "
        "chrF 45.10 (1.2s)  (new best)",
        "[10:00:05 INFO nmt.train] epoch 6 done at step 204",
        "[10:00:06 INFO nmt.train] step 300: loss 3.500, lr 9.00e-04, 110000 target tokens/s, "
        "grad norm 0.90",
        "[10:00:07 INFO nmt.train] averaged step_00000100, step_00000200: validation loss 2.000 "
        "BLEU 21.00 chrF 46.00 (best single checkpoint: BLEU 20.50 at step 200) -> x/averaged.pt",
    ]
    f = gc.LogFollower()
    for i, line in enumerate(lines):
        f.feed(line, 10.0 + i)
    assert f.model == {"class": "Transformer", "parameters": 7578624, "device": "cuda"}
    assert (f.train_pairs, f.batches_per_epoch, f.train_start) == (28997, 34, 11.0)
    [v] = f.validations
    assert (v["step"], v["bleu"], v["chrf"], v["seconds"]) == (200, 20.5, 45.1, 1.2)
    assert (v["wall_s"], v["since_train_start_s"]) == (14.0, 3.0)
    assert f.tokens_per_s() == {"median": 105000.0, "mean": 105000.0, "n": 2}
    assert f.averaged["bleu"] == 21.0 and f.averaged["checkpoints"] == [
        "step_00000100",
        "step_00000200",
    ]
    assert f.epochs == [{"epoch": 6, "step": 204, "wall_s": 15.0}]


def test_gpu_quick_preset():
    cfg = compose_config("train", ["experiment=gpu_quick"])
    validate(cfg)
    assert cfg.model.d_model == 256 and cfg.model.enc_layers == 3  # the default architecture
    assert str(cfg.trainer.precision) == "bf16"
    assert cfg.trainer.max_time == 180 and cfg.optim.decay_over == "time"
    assert cfg.optim.schedule == "linear" and cfg.trainer.patience == 0
    assert cfg.trainer.val_sentences == 0 and cfg.trainer.average_last == 5
    assert (cfg.decode.beam, cfg.decode.checkpoint) == (5, "auto")
    assert cfg.data.max_tokens >= 12000


# ------------------------------------------------------------------------------ the whole check


@pytest.mark.slow
def test_whole_check_on_cpu(tmp_path, multi30k):
    corpus = write_subset(multi30k, tmp_path / "corpus", "train", 200)
    overrides = [
        *corpus_overrides(corpus, tmp_path),
        *TINY_TRANSFORMER,
        "data.max_tokens=600",
        "trainer.precision=32",
        "trainer.threads=1",
        "trainer.val_every=25",
        "trainer.log_every=10",
        "optim.warmup_steps=30",
    ]
    out = tmp_path / "check" / "gpu_check.json"
    args = ["--device", "cpu", "--train-seconds", "6", "--bench-steps", "2", "--bench-warmup", "1"]
    args += ["--out", str(out)] + [a for o in overrides for a in ("--override", o)]
    env = {"PYTHON": sys.executable, "NMT_GPU_SITE": str(tmp_path / "site")}
    result = run_script(args, {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, 300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "validation BLEU over time" in result.stdout and "MFU" in result.stdout
    r = json.loads(out.read_text())
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

"""The built wheel: it carries the library alone (no benchmarks, no docs generator) with every
config, and its commands start and train outside a checkout."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from nmt.cli import CONFIG_DIR, config_dir

from .helpers import REPO, tiny_run_overrides

# what the build reads: a fresh copy, like the clone `pip install git+<url>` builds from, so that
# nothing left in the checkout (build/, *.egg-info) reaches the wheel
BUILD_INPUTS = ("pyproject.toml", "README.md", "nmt", "configs")


def run(cmd: list[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run a command; its stdout, or a failure that shows its output."""
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def build_wheel(tmp_path: Path) -> Path:
    """Build nmt's wheel offline with this interpreter's setuptools; returns its path."""
    src = tmp_path / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(REPO / name, src / name, ignore=ignore)
        else:
            shutil.copy2(REPO / name, src / name)
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", dist, src], src)
    (wheel,) = dist.glob("nmt-*.whl")
    return wheel


def files_under(root: Path, pattern: str) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob(pattern) if p.is_file()}


def make_venv(venv: Path, wheel: Path) -> Path:
    """A venv holding only the wheel's nmt, that sees this environment's other packages.

    A plain directory line in a .pth file only extends sys.path: the .pth files inside that
    directory (among them the finder of an editable nmt) are not run, so the checkout stays out.
    Returns the venv's site-packages.
    """
    run([sys.executable, "-m", "venv", "--without-pip", venv], venv.parent)
    python = venv / "bin" / "python"
    query = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = Path(run([python, "-c", query], venv.parent).strip())
    outer = [*site.getsitepackages(), site.getusersitepackages()]
    (purelib / "outer_env.pth").write_text("".join(f"{p}\n" for p in outer if Path(p).is_dir()))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    run([*pip, "--python", python, "install", "--no-deps", "--no-index", wheel], venv.parent)
    return purelib


def test_config_dir_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$NMT_CONFIG_DIR, else ./configs holding a train.yaml, else the configs shipped with nmt."""
    assert (Path(CONFIG_DIR) / "train.yaml").is_file()
    cwd = tmp_path.resolve()
    monkeypatch.delenv("NMT_CONFIG_DIR", raising=False)
    monkeypatch.chdir(cwd)
    assert config_dir() == CONFIG_DIR
    (cwd / "configs").mkdir()
    assert config_dir() == CONFIG_DIR  # a configs/ without train.yaml is someone else's
    (cwd / "configs" / "train.yaml").write_text("defaults:\n  - train_schema\n")
    assert config_dir() == str(cwd / "configs")
    monkeypatch.setenv("NMT_CONFIG_DIR", str(cwd / "mine"))
    assert config_dir() == str(cwd / "mine")


@pytest.mark.slow(seconds=16)
def test_installed_wheel_carries_the_configs_and_trains_outside_the_checkout(
    corpus: Path, tmp_path: Path
) -> None:
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    # the library alone: the benchmarks and the docs generator stay in the checkout
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"nmt"}
    shipped = {n.removeprefix("nmt/configs/") for n in names if n.startswith("nmt/configs/")}
    assert shipped == files_under(REPO / "configs", "*.yaml")
    # the package list in pyproject.toml is explicit: every module of the checkout is in it
    modules = {n.removeprefix("nmt/") for n in names if n.startswith("nmt/") and n.endswith(".py")}
    assert modules == files_under(REPO / "nmt", "*.py")
    assert "nmt/viz/explorer.html" in names  # the explorer page's template

    purelib = make_venv(tmp_path / "venv", wheel)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NMT_CONFIG_DIR")}
    elsewhere = tmp_path / "elsewhere"  # a working directory without configs/
    elsewhere.mkdir()
    probe = (
        "import json, sys, nmt, nmt.cli as c; editable = [m for m in sys.modules "
        "if 'editable' in m]; print(json.dumps([nmt.__file__, c.config_dir(), editable]))"
    )
    python = tmp_path / "venv" / "bin" / "python"
    where, cfg_dir, editable = json.loads(run([python, "-c", probe], elsewhere, env))
    assert Path(where) == purelib / "nmt" / "__init__.py"
    assert Path(cfg_dir) == purelib / "nmt" / "configs"
    assert editable == []  # an editable install's finder did not load

    for command in ("nmt-train", "nmt-eval", "nmt-serve"):  # each imports its whole stack
        shown = run([tmp_path / "venv" / "bin" / command, "--help"], elsewhere, env)
        assert "== Config ==" in shown, command
    run_dir = tmp_path / "run"
    overrides = tiny_run_overrides(corpus, tmp_path, "trainer.max_steps=5", "trainer.device=cpu")
    train = [tmp_path / "venv" / "bin" / "nmt-train", *overrides, f"hydra.run.dir={run_dir}"]
    run(train, elsewhere, {**env, "OMP_NUM_THREADS": "1"})
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    steps = [json.loads(line).get("step", 0) for line in (run_dir / "metrics.jsonl").open()]
    assert max(steps) == 5
    # Hydra records where the primary config came from: the installed package
    hydra_yaml = (run_dir / ".hydra" / "hydra.yaml").read_text()
    assert f"path: {purelib / 'nmt' / 'configs'}" in hydra_yaml
    assert list(elsewhere.iterdir()) == []

"""The wheel is the library alone: built from the checkout, installed into a new virtual
environment outside it, its commands start and train with nothing from the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from .helpers import REPO, tiny_run_overrides

# what the build reads: the project file, the readme it names, the package and its configs
BUILD_INPUTS = ("pyproject.toml", "README.md", "nmt", "configs")


def build_wheel(out: Path) -> Path:
    """The wheel of a copy of the checkout's build inputs (the build leaves its files in the
    tree it builds, so the checkout itself stays as it was)."""
    source = out / "source"
    for name in BUILD_INPUTS:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, source / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*cmd, "-w", str(out / "dist"), str(source)], check=True, timeout=300)
    (wheel,) = (out / "dist").glob("nmt-*.whl")
    return wheel


def new_venv(where: Path) -> Path:
    """A virtual environment without nmt whose interpreter finds this one's installed
    dependencies: their site folder joined by a .pth line, so that its own .pth files (the
    editable install of the checkout among them) are not run. Returns its bin/ folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    query = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run([python, "-c", query], capture_output=True, text=True, check=True)
    deps = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    Path(site.stdout.strip(), "dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")
    return where / "bin"


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the bin/ folder of a new venv it is installed in)."""
    work = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(work)
    bin_dir = new_venv(work / "venv")
    pip = [sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install"]
    subprocess.run([*pip, "--no-deps", "-q", str(wheel)], check=True, timeout=300)
    return wheel, bin_dir


def outside(tmp_path: Path) -> dict[str, str]:
    """An environment with nothing pointing into the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["HOME"] = str(tmp_path)
    return env


def test_the_wheel_holds_the_library_alone(installed_wheel: tuple[Path, Path]) -> None:
    wheel, _ = installed_wheel
    with zipfile.ZipFile(wheel) as z:
        tops = {name.split("/")[0] for name in z.namelist()}
        names = z.namelist()
    assert tops == {"nmt", next(t for t in tops if t.endswith(".dist-info"))}
    assert "nmt/configs/train.yaml" in names and "nmt/serve/page.html" in names
    assert not [n for n in names if "/bench" in n or n.startswith("nmt/docs")]


@pytest.mark.slow(seconds=40)
def test_the_installed_commands_run_outside_the_checkout(
    installed_wheel: tuple[Path, Path], corpus: Path, tmp_path: Path
) -> None:
    _, bin_dir = installed_wheel
    env = outside(tmp_path)
    where = "import nmt, sys; print(nmt.__file__); print(sys.prefix)"
    found = subprocess.run(
        [bin_dir / "python", "-c", where], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    module, prefix = found.stdout.split()
    assert Path(prefix) == bin_dir.parent and Path(module).is_relative_to(bin_dir.parent), found
    for command in ("nmt-train", "nmt-eval", "nmt-serve"):
        shown = subprocess.run(
            [bin_dir / command, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert shown.returncode == 0 and "Override" in shown.stdout, (command, shown.stderr)
    overrides = tiny_run_overrides(corpus, tmp_path, "trainer.max_steps=5", "trainer.val_every=5")
    run_dir = tmp_path / "run"
    trained = subprocess.run(
        [bin_dir / "nmt-train", *overrides, "trainer.threads=1", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    steps = [json.loads(line).get("step") for line in (run_dir / "metrics.jsonl").open()]
    assert max(s for s in steps if s is not None) == 5

"""Wheels of the packages nmt imports that a fresh GPU machine may lack, for the GPU check
(:mod:`benchmarks.gpu_check`): which ones this Python needs, an install without pip, and the
download for ``make gpu-wheels``.

Standard library only at load time: these helpers run before those packages are there
(``scripts/gpu_check.py missing-wheels``, ``unpack-wheels``, ``fetch-wheels``).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.gpu_check import CheckFailed

WHEELS_DIR = Path("scripts") / "gpu_wheels"  # in the repository: where make gpu-wheels puts them

# Packages that nmt imports and a fresh GPU machine may lack: import name -> distribution.
# They travel as wheels (make gpu-wheels). PyTorch, numpy, sentencepiece, sacrebleu and
# tensorboard must already be installed there.
WHEEL_PACKAGES = {
    "hydra": "hydra-core",
    "omegaconf": "omegaconf",
    "antlr4": "antlr4-python3-runtime",
    "yaml": "PyYAML",
    "tqdm": "tqdm",
    "matplotlib": "matplotlib",
    "contourpy": "contourpy",
    "cycler": "cycler",
    "fontTools": "fonttools",
    "kiwisolver": "kiwisolver",
    "PIL": "pillow",
    "pyparsing": "pyparsing",
    "dateutil": "python-dateutil",
    "tzdata": "tzdata",
    "packaging": "packaging",
    "sacremoses": "sacremoses",  # nmt-eval's papers' BLEU
    "joblib": "joblib",  # sacremoses imports it
}
# Packages only some parts of the check need, installed where their wheel is there: the
# CTranslate2 engine (its wheel, about 40 MB with its CUDA kernels, has a folder of its own)
OPTIONAL_PACKAGES = {"ctranslate2": "ctranslate2"}
OPTIONAL_DIR = "optional"  # in the wheel folder
SOURCE_ONLY = {"antlr4-python3-runtime"}  # no wheel on the index: built from its sdist
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def normalize(name: str) -> str:
    """A distribution name as wheel file names spell it (PEP 503, underscores, lower case)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _lacking(packages: dict[str, str], present: Callable[[str], bool] | None) -> list[str]:
    present = present or (lambda module: importlib.util.find_spec(module) is not None)
    return [dist for module, dist in packages.items() if not present(module)]


def _by_dist(wheel_dir: Path) -> dict[str, Path]:
    files = sorted(wheel_dir.glob("*.whl")) if wheel_dir.is_dir() else []
    return {normalize(f.name.split("-", 1)[0]): f for f in files}


def wheels_needed(
    wheel_dir: Path, present: Callable[[str], bool] | None = None
) -> tuple[list[Path], list[str]]:
    """Wheels in ``wheel_dir`` for the packages this Python lacks, and the lacking ones
    that have no wheel there."""
    wanted, by_dist = _lacking(WHEEL_PACKAGES, present), _by_dist(wheel_dir)
    found = [by_dist[normalize(d)] for d in wanted if normalize(d) in by_dist]
    absent = [d for d in wanted if normalize(d) not in by_dist]
    return found, absent


def optional_wheels(wheel_dir: Path, present: Callable[[str], bool] | None = None) -> list[Path]:
    """Wheels in ``wheel_dir/optional`` for the optional packages this Python lacks (one
    without a wheel there is left out: the parts that need it are skipped)."""
    by_dist = _by_dist(wheel_dir / OPTIONAL_DIR)
    return [by_dist[normalize(d)] for d in _lacking(OPTIONAL_PACKAGES, present)
            if normalize(d) in by_dist]  # fmt: skip


def wrong_python(wheels: Sequence[Path], version: tuple[int, int] | None = None) -> list[Path]:
    """The wheels built for another CPython than this one (``cp312`` on Python 3.11)."""
    major, minor = version or sys.version_info[:2]
    ours = f"cp{major}{minor}"
    bad = []
    for wheel in wheels:
        tags = wheel.name[: -len(".whl")].split("-")[-3].split(".")
        if not any(t.startswith("py") or t == ours for t in tags):
            bad.append(wheel)
    return bad


def missing_wheels_message(wheel_dir: Path, absent: Sequence[str]) -> str:
    where = f"{wheel_dir} has no wheel for them" if wheel_dir.is_dir() else f"{wheel_dir} is absent"
    return (
        f"error: this Python ({sys.executable}, {sys.version.split()[0]}) lacks "
        f"{', '.join(absent)}, and {where}. Run `make gpu-wheels` on a machine with network "
        f"access and bring {WHEELS_DIR}/ along with the repository, or "
        "set NMT_GPU_WHEELS to a folder holding those wheels."
    )


def wheels_to_install(wheel_dir: Path) -> list[Path]:
    """The wheels of ``wheel_dir`` that this Python needs, and those of its optional packages
    that it lacks; CheckFailed says what is missing (no wheel for a package it lacks, or wheels
    for another Python)."""
    found, absent = wheels_needed(wheel_dir)
    if absent:
        raise CheckFailed(missing_wheels_message(wheel_dir, absent))
    found += optional_wheels(wheel_dir)
    bad = wrong_python(found)
    if bad:
        raise CheckFailed(
            f"error: {', '.join(w.name for w in bad)} in {wheel_dir} are not for this "
            f"Python ({sys.executable}, {sys.version.split()[0]}): run `make gpu-wheels "
            f"GPU_PYTHON_VERSION={sys.version_info[0]}.{sys.version_info[1]}` for it"
        )
    return found


def unpack_wheel(wheel: Path, site: Path) -> None:
    """Install a wheel by extracting it into ``site`` (what pip does for a --target install,
    without scripts, headers and data files)."""
    root = site.resolve()
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            parts = info.filename.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            target = root.joinpath(*parts).resolve()
            if root not in target.parents:
                raise CheckFailed(f"{wheel.name}: entry {info.filename!r} leaves the target")
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                target.chmod(mode | 0o600)


def installed_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        raise CheckFailed(
            f"{dist} is not installed in this Python ({sys.executable}): run `make install` first"
        ) from None


def download(dest: Path, pins: dict[str, str], python_version: str) -> None:
    """``pip download`` of the binary wheels of ``pins`` for the GPU machine into ``dest``
    (emptied of wheels first)."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    binary = [f"{d}=={v}" for d, v in pins.items() if d not in SOURCE_ONLY]
    platforms = [arg for plat in PLATFORMS for arg in ("--platform", plat)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "--python-version", python_version, "--implementation", "cp", *platforms,
         "-d", str(dest), *binary],
        check=True,
    )  # fmt: skip


def fetch_wheels(dest: Path, python_version: str) -> list[Path]:
    """Download (or build) the wheels, pinned to the versions installed here; the optional
    ones into ``dest/optional``."""
    pins = {dist: installed_version(dist) for dist in WHEEL_PACKAGES.values()}
    optional = {dist: installed_version(dist) for dist in OPTIONAL_PACKAGES.values()}
    download(dest, pins, python_version)
    download(dest / OPTIONAL_DIR, optional, python_version)
    pip = [sys.executable, "-m", "pip"]
    for dist in SOURCE_ONLY:
        subprocess.run(
            [*pip, "wheel", "--no-deps", f"{dist}=={pins[dist]}", "-w", str(dest)], check=True
        )
    _, absent = wheels_needed(dest, present=lambda _module: False)
    came = _by_dist(dest / OPTIONAL_DIR)
    absent += [d for d in OPTIONAL_PACKAGES.values() if normalize(d) not in came]
    if absent:
        raise CheckFailed(f"no wheel came for: {', '.join(absent)}")
    return sorted(dest.glob("*.whl")) + sorted((dest / OPTIONAL_DIR).glob("*.whl"))

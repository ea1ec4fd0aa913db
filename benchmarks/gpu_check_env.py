"""The GPU check's first step (:mod:`benchmarks.gpu_check`): the PyTorch it runs with against
nmt's floor, and the device (GPU name, compute capability, GPU count, CUDA, cuDNN and NCCL
versions, whether it computes bf16 and TF32, triton for torch.compile, CTranslate2 and the GPUs
it sees).

nmt refuses to import under a PyTorch older than its floor (``nmt.TORCH_FLOOR``), so this step
imports nothing of nmt: it reads the floor from the source, ``TORCH_FLOOR`` in
``nmt/__init__.py`` where it is defined there, and the ``torch>=`` requirement of
``pyproject.toml``. Standard library only at load time; torch is imported when the step runs.
"""

from __future__ import annotations

import ast
import importlib.util
import platform
import re
import sys
from pathlib import Path
from typing import Any

FLOOR_CONSTANT = "TORCH_FLOOR"
NATIVE_CAPABILITY = (8, 0)  # bf16 and TF32 in hardware: Ampere and later


def floor_constant(repo: Path) -> tuple[int, ...] | None:
    """``TORCH_FLOOR`` as ``nmt/__init__.py`` assigns it (a tuple of ints), read without
    importing nmt; None where it assigns none."""
    path = repo / "nmt" / "__init__.py"
    if not path.is_file():
        return None
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == FLOOR_CONSTANT for t in targets):
            value = ast.literal_eval(node.value)
            return tuple(int(v) for v in value)
    return None


def floor_requirement(repo: Path) -> tuple[int, ...] | None:
    """The release of ``pyproject.toml``'s ``torch>=X.Y`` requirement; None without one."""
    path = repo / "pyproject.toml"
    if not path.is_file():
        return None
    found = re.search(r"""["']torch\s*>=\s*(\d+(?:\.\d+)*)""", path.read_text(encoding="utf-8"))
    return tuple(int(p) for p in found.group(1).split(".")) if found else None


def dotted(version: tuple[int, ...] | None) -> str:
    return ".".join(map(str, version)) if version else "-"


def torch_floor(repo: Path) -> dict[str, Any]:
    """nmt's PyTorch floor: the constant where nmt defines one, else pyproject's requirement;
    ``agree`` says whether both say the same (where both exist)."""
    constant, requirement = floor_constant(repo), floor_requirement(repo)
    floor = constant or requirement
    source = f"nmt.{FLOOR_CONSTANT}" if constant else "pyproject.toml" if requirement else None
    return {
        "floor": dotted(floor) if floor else None,
        "source": source,
        "constant": dotted(constant) if constant else None,
        "requirement": dotted(requirement) if requirement else None,
        "agree": constant is None or requirement is None or constant == requirement,
    }


def torch_meets(installed: str, floor: str | None) -> bool:
    """Whether the PyTorch version ``installed`` is the floor or later, by its release numbers
    as nmt compares them (``2.4.0a0+git...`` counts as 2.4); True without a floor or for a
    version without release numbers (nmt lets those pass too)."""
    found = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(installed))
    if not floor or found is None:
        return True
    wanted = tuple(int(p) for p in floor.split("."))
    return tuple(int(p) for p in found.group(1).split(".")) >= wanted


def ctranslate2_facts() -> dict[str, Any]:
    """CTranslate2's version and the CUDA devices it sees (None where it is not installed)."""
    if importlib.util.find_spec("ctranslate2") is None:
        return {"version": None, "cuda_devices": None}
    try:
        import ctranslate2

        return {
            "version": ctranslate2.__version__,
            "cuda_devices": ctranslate2.get_cuda_device_count(),
        }
    except Exception as e:  # a broken install is a finding, not a crash of the check
        return {"version": None, "cuda_devices": None, "error": f"{type(e).__name__}: {e}"}


def cuda_facts(torch: Any, device: Any) -> dict[str, Any]:
    """The GPU's name, compute capability, memory and the CUDA libraries' versions."""
    props = torch.cuda.get_device_properties(device)
    capability = list(torch.cuda.get_device_capability(device))
    nccl = None
    if torch.distributed.is_available() and hasattr(torch.cuda, "nccl"):
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # no NCCL in this build
            nccl = None
    native = tuple(capability) >= NATIVE_CAPABILITY
    return {
        "device_name": torch.cuda.get_device_name(device),
        "capability": capability,
        "gpus": torch.cuda.device_count(),
        "memory_gib": round(props.total_memory / 2**30, 1),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "nccl": nccl,
        "native_bf16": native,
        "tf32": native,
    }


def environment(device_name: str, repo: Path) -> dict[str, Any]:
    """Everything the first step reports; ``problems`` lists what stops the check (a PyTorch
    below the floor, a CUDA device that is not there)."""
    import torch

    floor = torch_floor(repo)
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "torch": str(torch.__version__),
        "torch_floor": floor,
        "torch_ok": torch_meets(torch.__version__, floor["floor"]),
        "device": device_name,
        "device_type": torch.device(device_name).type,
        "capability": None,
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "triton": importlib.util.find_spec("triton") is not None,
        "ctranslate2": ctranslate2_facts(),
        "problems": [],
    }
    if not env["torch_ok"]:
        env["problems"].append(
            f"torch {torch.__version__} is older than nmt's floor {floor['floor']} "
            f"({floor['source']}): pip install 'torch>={floor['floor']}'"
        )
    if env["device_type"] == "cuda":
        if not torch.cuda.is_available():
            env["problems"].append(f"--device {device_name}: torch.cuda.is_available() is False")
        else:
            env.update(cuda_facts(torch, torch.device(device_name)))
    return env


def describe(env: dict[str, Any]) -> list[str]:
    """The lines the check prints first."""
    floor = env["torch_floor"]
    sources = [f"nmt.{FLOOR_CONSTANT} {floor['constant']}"] if floor["constant"] else []
    sources += [f"pyproject torch>={floor['requirement']}"] if floor["requirement"] else []
    verdict = "ok" if env["torch_ok"] else "TOO OLD"
    lines = [
        f"torch {env['torch']} (python {env['python']}); nmt's floor {floor['floor'] or '-'} "
        f"({'; '.join(sources) or 'not found'}): {verdict}"
    ]
    if not floor["agree"]:
        lines.append(
            f"note: nmt.{FLOOR_CONSTANT} ({floor['constant']}) and pyproject.toml "
            f"(torch>={floor['requirement']}) name different floors"
        )
    if env.get("capability"):
        cap = ".".join(map(str, env["capability"]))
        native = "native bf16 and TF32" if env["native_bf16"] else "no native bf16 or TF32"
        lines.append(
            f"device: {env['device_name']} ({env['device']}), compute capability {cap} "
            f"({native}), {env['gpus']} GPU(s) visible, {env['memory_gib']} GiB; "
            f"CUDA {env['cuda']}, cuDNN {env['cudnn']}, NCCL {env['nccl'] or '-'}"
        )
    else:
        lines.append(f"device: {env['device']} ({env['gpus']} GPU(s) visible)")
    ct2 = env["ctranslate2"]
    ct2_text = (
        f"ctranslate2 {ct2['version']} (sees {ct2['cuda_devices']} CUDA device(s))"
        if ct2["version"]
        else "ctranslate2: not installed"
    )
    lines.append(f"triton: {'yes' if env['triton'] else 'no'}; {ct2_text}")
    lines += [f"problem: {p}" for p in env["problems"]]
    return lines

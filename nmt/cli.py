"""What every command needs before it loads a model, without PyTorch: where the Hydra configs
are, and console/file logging. :mod:`nmt.runtime` re-exports these names."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path


def _shipped_config_dir() -> Path:
    """``nmt/configs`` of an installed package (the build copies ``configs/`` there), else the
    checkout's ``configs/`` beside the package (an editable install or a source tree)."""
    package = Path(__file__).resolve().parent
    installed = package / "configs"
    if (installed / "train.yaml").is_file():
        return installed
    return package.parent / "configs"


CONFIG_DIR = str(_shipped_config_dir())


def config_dir() -> str:
    """The Hydra config directory: $NMT_CONFIG_DIR, ./configs, else the configs shipped with nmt."""
    env = os.environ.get("NMT_CONFIG_DIR")
    if env:
        return str(Path(env).resolve())
    local = Path.cwd() / "configs"
    if (local / "train.yaml").is_file():
        return str(local)
    return CONFIG_DIR


def setup_logging(log_file: Path | None = None, rank: int = 0) -> None:
    """Console logging for rank 0 (warnings only elsewhere) and an appending log file."""
    root = logging.getLogger()
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    fmt = logging.Formatter("[%(asctime)s %(levelname)s %(name)s] %(message)s", "%H:%M:%S")
    for h in list(root.handlers):  # e.g. Hydra's multirun console handler: ours replaces it
        if type(h) is logging.StreamHandler and not getattr(h, "_nmt", False):
            root.removeHandler(h)
    if not any(getattr(h, "_nmt", False) for h in root.handlers):
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(fmt)
        console._nmt = True  # type: ignore[attr-defined]
        root.addHandler(console)
    if log_file is not None and rank == 0:
        for h in list(root.handlers):
            if getattr(h, "_nmt_file", False):
                root.removeHandler(h)
                h.close()
        log_file.parent.mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(log_file, mode="a", encoding="utf-8")
        fh.setFormatter(fmt)
        fh._nmt_file = True  # type: ignore[attr-defined]
        root.addHandler(fh)

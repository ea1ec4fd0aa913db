"""Checkpoints: atomic, self-verifying, safe to load.

File layout: the bytes of ``torch.save(payload)``, then a 48-byte trailer
``MAGIC (8) | payload length (8, little endian) | sha256 of the payload (32)``.
A truncated or corrupted file fails the length or checksum test with a clear error, before any
unpickling. Loading always uses ``torch.load(..., weights_only=True)``: a checkpoint can hold
tensors, numbers, strings, bytes and containers of them, never code.

Writes go through :func:`nmt.atomic.atomic_file`: a temporary file
(``.<name>.<random>.tmp``) in the same directory, fsynced, renamed over the target, then the
directory fsynced, so at every moment the file under the final name is either the old or the
new one. A crash can leave a temporary file behind; :func:`remove_temporaries` clears them.
"""

from __future__ import annotations

import hashlib
import io
import logging
import random
import re
import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from nmt.atomic import TEMP_SUFFIX, atomic_file
from nmt.store.gate import CheckpointError  # defined without PyTorch, for the gate

log = logging.getLogger(__name__)

MAGIC = b"NMTCKPT1"
_TRAILER = struct.Struct("<8sQ32s")
STEP_FILE = re.compile(r"^step_(\d+)\.pt$")  # a validation's checkpoint
RESUME_FILE = re.compile(r"^resume_(\d+)\.pt$")  # the clock's or a stop's: for resuming only


# --------------------------------------------------------------------------- writing


def remove_temporaries(directory: Path) -> list[Path]:
    """Delete the temporary files interrupted writes left in ``directory``.

    Only call this while nothing else writes into ``directory``. Returns the removed paths.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    stale = [p for p in directory.glob(f".*{TEMP_SUFFIX}") if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


class _Digesting:
    """A binary file's ``write`` that also counts and hashes what goes through it."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def save_checkpoint(payload: dict[str, Any], path: Path) -> None:
    """Serialise ``payload`` with a checksum trailer and write it atomically.

    The payload is streamed into the file as it is serialised (hashed on the way), never held
    whole in memory: a large model's checkpoint with its optimizer's moments takes no more
    memory to write than the tensors themselves.

    Raises :class:`CheckpointError` (naming the file and the reason, e.g. a full disk) when the
    file cannot be written; the file previously under that name is then left unchanged.
    """
    try:
        with atomic_file(path) as f:
            out = _Digesting(f)
            torch.save(payload, out)  # type: ignore[arg-type]
            f.write(_TRAILER.pack(MAGIC, out.size, out.sha.digest()))
    except OSError as e:
        raise CheckpointError(
            f"could not write checkpoint {path}: {e.strerror or e}; the previous checkpoint "
            "(if any) is unchanged"
        ) from e


# --------------------------------------------------------------------------- reading


CHUNK = 1 << 24  # bytes read at a time when a checkpoint's sha256 is checked


def _verified_length(path: Path) -> int:
    """The payload length of a checkpoint file, after the length and sha256 checks (the file
    read in chunks, never whole)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with open(path, "rb") as f:
            size = f.seek(0, io.SEEK_END)
            if size < _TRAILER.size:
                raise CheckpointError(f"checkpoint {path} is truncated ({size} bytes)")
            f.seek(size - _TRAILER.size)
            magic, length, digest = _TRAILER.unpack(f.read(_TRAILER.size))
            if magic != MAGIC:
                raise CheckpointError(
                    f"checkpoint {path} has no valid trailer: truncated, corrupted, or not "
                    "written by nmt"
                )
            body = size - _TRAILER.size
            if body != length:
                raise CheckpointError(
                    f"checkpoint {path} is truncated or padded: {body} payload bytes, "
                    f"expected {length}"
                )
            f.seek(0)
            sha = hashlib.sha256()
            left = length
            while left > 0:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    break
                sha.update(chunk)
                left -= len(chunk)
    except OSError as e:
        raise CheckpointError(f"checkpoint {path} cannot be read: {e.strerror or e}") from e
    if sha.digest() != digest:
        raise CheckpointError(f"checkpoint {path} is corrupted: its sha256 does not match")
    return length


class _Window(io.RawIOBase):
    """The first ``length`` bytes of a binary file, as a file of their own (the payload
    without its trailer, for ``torch.load``)."""

    def __init__(self, f: BinaryIO, length: int) -> None:
        super().__init__()
        self.f, self.length, self.pos = f, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(0, min(self.length, base + offset))
        return self.pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = min(len(view), self.length - self.pos)
        if n <= 0:
            return 0
        self.f.seek(self.pos)
        got = self.f.readinto(view[:n])  # type: ignore[attr-defined]
        self.pos += got or 0
        return got or 0


def verify_checkpoint(path: Path) -> None:
    """Check a checkpoint's length and sha256 without unpickling it; CheckpointError if bad."""
    _verified_length(path)


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Verify and load a checkpoint written by :func:`save_checkpoint` (read from the file,
    not from a copy of it in memory)."""
    length = _verified_length(path)
    try:
        with open(path, "rb") as f:
            window = io.BufferedReader(_Window(f, length), buffer_size=1 << 20)
            return torch.load(window, map_location=map_location, weights_only=True)
    except OSError as e:
        raise CheckpointError(f"checkpoint {path} cannot be read: {e.strerror or e}") from e
    except Exception as e:  # the safe unpickler refuses anything but plain data
        raise CheckpointError(f"checkpoint {path} could not be loaded safely: {e}") from e


def _numbered(directory: Path, *patterns: re.Pattern[str]) -> list[Path]:
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in directory.iterdir()
        for pattern in patterns
        if (m := pattern.match(p.name))
    ]
    return [p for _, p in sorted(found)]


def step_checkpoints(directory: Path) -> list[Path]:
    """The validations' ``step_N.pt`` files in ``directory``, oldest (lowest N) first: the ones
    kept by ``trainer.keep_last`` and averaged."""
    return _numbered(directory, STEP_FILE)


def resume_checkpoints(directory: Path) -> list[Path]:
    """The ``resume_N.pt`` files in ``directory`` (written by the clock or a stop between
    validations), oldest first."""
    return _numbered(directory, RESUME_FILE)


def numbered_name(step: int, validated: bool) -> str:
    """The file name of a checkpoint at ``step``: ``step_N.pt`` after a validation, else
    ``resume_N.pt`` (the names :data:`STEP_FILE` and :data:`RESUME_FILE` match)."""
    return f"{'step' if validated else 'resume'}_{step:08d}.pt"


def all_checkpoints(directory: Path) -> list[Path]:
    """Every numbered checkpoint in ``directory``, ``step_N.pt`` and ``resume_N.pt``, oldest
    first: what a run can resume from."""
    return _numbered(directory, STEP_FILE, RESUME_FILE)


# --------------------------------------------------------------------------- random state


def _cuda_index(device: torch.device | None) -> int:
    """The index of the CUDA device a process draws from: ``device``'s, else the current one
    (which :func:`nmt.runtime.distributed.init_distributed` sets to a rank's own GPU)."""
    if device is not None and device.index is not None:
        return device.index
    return torch.cuda.current_device()


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """Python, numpy and torch (CPU, CUDA) random states, in a weights_only-loadable form.

    With CUDA: the state of every visible GPU (``cuda``) and the index of the one this process
    draws from (``cuda_device``: ``device``'s, else the current device), whose state
    :func:`set_rng_state` gives back to the process's own GPU wherever it resumes.
    """
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
        state["cuda_device"] = _cuda_index(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Restore the states saved by :func:`rng_state`; ``device``: the CUDA device this process
    draws from (default: the current one)."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            n["keys"].numpy().astype(np.uint32),
            n["pos"],
            n["has_gauss"],
            n["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        _set_cuda_rng_state(state["cuda"], state.get("cuda_device"), _cuda_index(device))


def _set_cuda_rng_state(saved: Any, saved_device: int | None, own: int) -> None:
    """Give each visible GPU its saved state, and this process's GPU (``own``) the state of the
    GPU the saving process drew from (``saved_device``; checkpoints without it: the GPU of the
    same index). A checkpoint saved where more or fewer GPUs were visible (a resume under a
    narrower ``CUDA_VISIBLE_DEVICES``, a requeued job on a smaller allocation) restores what
    matches and says what does not."""
    states = [saved] if isinstance(saved, torch.Tensor) else list(saved)
    visible = torch.cuda.device_count()
    for index, cuda_state in enumerate(states[:visible]):
        torch.cuda.set_rng_state(cuda_state, index)
    source = own if saved_device is None else saved_device
    if source >= len(states):
        log.warning(
            "the checkpoint holds the CUDA random states of %d GPU(s), none for cuda:%d, the "
            "GPU this process draws from: it keeps its seeded state, so dropout does not "
            "continue as in an unbroken run",
            len(states), source,
        )  # fmt: skip
        return
    if source != own:
        torch.cuda.set_rng_state(states[source], own)
    if len(states) != visible:
        log.info(
            "the checkpoint holds the CUDA random states of %d GPU(s), %d are visible now: "
            "cuda:%d takes the state of saved cuda:%d",
            len(states), visible, own, source,
        )  # fmt: skip


# --------------------------------------------------------------------------- comparing


# parts of a checkpoint's training state that measure wall-clock time, not the run's course
_CLOCK_KEYS = ("train_time", "decay_start")


def content_digest(payload: dict[str, Any]) -> dict[str, str]:
    """A sha256 (hex, first 16 digits) of each deterministic part of a checkpoint.

    The parts: model, optimizer, scheduler, scaler, rng, state (without its clock fields),
    history (the validations, without their durations) and tokenizers. Two runs of the same
    code, config and seed on the same machine give equal digests; a change that claims not to
    alter training must keep them equal. The config is left out: it names the run's folders.
    """
    state = dict(payload.get("state") or {})
    history = [{k: v for k, v in e.items() if k != "seconds"} for e in state.pop("history", [])]
    for key in _CLOCK_KEYS:
        state.pop(key, None)
    parts = {
        "model": payload.get("model"),
        "optimizer": payload.get("optimizer"),
        "scheduler": payload.get("scheduler"),
        "scaler": payload.get("scaler"),
        "rng": payload.get("rng"),
        "state": state,
        "history": history,
        "tokenizers": payload.get("tokenizers"),
    }
    digests = {}
    for name, value in parts.items():
        h = hashlib.sha256()
        _feed(h, value)
        digests[name] = h.hexdigest()[:16]
    return digests


def _feed(h: Any, value: Any) -> None:
    """Hash a nested value: tensors by dtype, shape and bytes; containers in key order."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous().reshape(-1)
        h.update(f"{t.dtype}{tuple(value.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            h.update(repr(key).encode())
            _feed(h, value[key])
    elif isinstance(value, (list, tuple)):
        h.update(b"[")
        for item in value:
            _feed(h, item)
        h.update(b"]")
    else:
        h.update(repr(value).encode())

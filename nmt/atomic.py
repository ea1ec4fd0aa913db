"""Files that are never seen half-written: checkpoints, downloads, tokenizers, manifests, caches.

A file is written under a temporary name beside its destination (``.<name>.<random>.tmp``),
flushed and fsynced, renamed over the destination, and then the directory is fsynced. At every
moment the destination holds either the old bytes or the new ones, and once the write returns
the new ones survive a crash or a power loss. While it is written the temporary file is locked
(where POSIX locks exist): the next write of the same destination deletes the temporary files
that no process holds, those of a killed writer. No PyTorch here, so every layer can use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

try:
    import fcntl
except ImportError:  # not POSIX: temporary files are not locked (see _delete_unless_locked)
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

TEMP_SUFFIX = ".tmp"


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort: not every system allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(dest: Path) -> Iterator[BinaryIO]:
    """A new binary file that replaces ``dest`` when the ``with`` block ends normally.

    When the block raises, ``dest`` is left as it was and the temporary file is deleted. The
    new file gets the permissions a plain ``open(dest, "wb")`` would give it (umask).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(dest)
    f, tmp = _locked_temporary(dest)
    try:
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            if fcntl is None:
                f.close()  # without POSIX semantics an open file cannot be renamed
            os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(dest.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` durably, so that a crash leaves the old file or the new one."""
    with atomic_file(path) as f:
        f.write(data)


def _locked_temporary(dest: Path) -> tuple[BinaryIO, Path]:
    """A new, locked temporary file beside ``dest`` and its path."""
    while True:
        tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        if fcntl is None:
            break
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:  # another process may have deleted it as stale before we locked it
            if os.path.samestat(os.fstat(fd), os.stat(tmp)):
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    return os.fdopen(fd, "wb"), tmp


def remove_stale_temporaries(dest: Path) -> list[Path]:
    """Delete the temporary files of ``dest`` that no running process is writing.

    Only names of the form ``.<dest name>.<random>.tmp`` are touched. A file counts as stale
    when its lock can be taken (its writer is gone); without POSIX locks, when it can be
    deleted (an open file cannot be). Returns the deleted paths.
    """
    dest = Path(dest)
    pattern = re.compile(rf"\.{re.escape(dest.name)}\.[A-Za-z0-9_]+{re.escape(TEMP_SUFFIX)}")
    removed: list[Path] = []
    if not dest.parent.is_dir():
        return removed
    for path in sorted(dest.parent.iterdir()):
        if pattern.fullmatch(path.name) and _delete_unless_locked(path):
            log.info("deleted %s, left by an interrupted write", path)
            removed.append(path)
    return removed


def _delete_unless_locked(path: Path) -> bool:
    """Delete ``path`` unless another open file holds its lock; True if it was deleted."""
    if fcntl is None:
        try:
            path.unlink()
        except OSError:
            return False
        return True
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path.unlink()
    except OSError:  # locked by a live writer, or already gone
        return False
    finally:
        os.close(fd)
    return True


def sha256_range(path: str | Path, start: int, end: int | None = None) -> str:
    """Hex sha256 of a file's bytes ``[start, end)`` (to the end without ``end``), read a
    megabyte at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = None if end is None else end - start
        while left is None or left > 0:
            chunk = f.read(1 << 20 if left is None else min(1 << 20, left))
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h.hexdigest()


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    return sha256_range(path, 0)

"""What every command needs before it loads a model, without PyTorch: where the Hydra configs
are, console/file logging (and warnings held until a run's log file opens), how a user's error
ends a command (:func:`exit_on_error`), and the progress bars of long steps (:class:`Progress`)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from nmt.environment import config_dir_override

# the exit status of a command stopped by an error the user can fix
USER_ERROR_EXIT = 2


class UserError(Exception):
    """An error the user can fix: a config value, an input file, a checkpoint. The base of
    nmt.config.ConfigError, nmt.data.corpus.DataError and nmt.store.gate.CheckpointError."""


@contextlib.contextmanager
def exit_on_error(log: logging.Logger, *also: type[BaseException]) -> Iterator[None]:
    """Run a command's body: a :class:`UserError` (or one of ``also``) raised in it is logged as
    its one-line message, without a traceback, and ends the command with exit status 2."""
    try:
        yield
    except (UserError, *also) as e:
        log.error("%s", e)
        raise SystemExit(USER_ERROR_EXIT) from None


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


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
    override = config_dir_override()
    if override is not None:
        return str(override)
    local = Path.cwd() / "configs"
    if (local / "train.yaml").is_file():
        return str(local)
    return CONFIG_DIR


class _Console(logging.StreamHandler):
    """The console handler: it writes to ``sys.stderr`` as it is when a record comes, not as it
    was when logging was set up, since a notebook or a test harness that captures output may
    have replaced (and closed) that stream in between."""

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass  # always the current sys.stderr


def setup_logging(log_file: Path | None = None, rank: int = 0) -> None:
    """Console logging for rank 0 (warnings only elsewhere) and an appending log file."""
    root = logging.getLogger()
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    fmt = logging.Formatter("[%(asctime)s %(levelname)s %(name)s] %(message)s", "%H:%M:%S")
    for h in list(root.handlers):  # e.g. Hydra's multirun console handler: ours replaces it
        if type(h) is logging.StreamHandler and not getattr(h, "_nmt", False):
            root.removeHandler(h)
    if not any(getattr(h, "_nmt", False) for h in root.handlers):
        console = _Console()
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


class _Held(logging.Handler):
    """Keeps the warnings logged while the run's log file is not open yet."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def held_warnings() -> Iterator[list[logging.LogRecord]]:
    """Collect the warnings logged inside the block (they still reach the console), so that
    :func:`write_to_log_file` can add them to a log file opened afterwards."""
    held = _Held()
    root = logging.getLogger()
    root.addHandler(held)
    try:
        yield held.records
    finally:
        root.removeHandler(held)


def write_to_log_file(records: list[logging.LogRecord]) -> None:
    """Write ``records`` to the log file of :func:`setup_logging` (not to the console)."""
    for handler in logging.getLogger().handlers:
        if getattr(handler, "_nmt_file", False):
            for record in records:
                handler.handle(record)


# --------------------------------------------------------------------------- progress bars

# a progress callback: called with the units of work (sentences, bytes) just done
Advance = Callable[[int], None]


def on_terminal(stream: TextIO, enabled: bool = True) -> bool:
    """Whether a progress bar is drawn on ``stream``: only when enabled and on a terminal, so
    that log files, pipes and CI output never get bar fragments."""
    return enabled and stream.isatty()


def no_progress(done: int) -> None:
    """The callback of a bar that is not drawn (the default of functions that take one)."""


_SENTENCES: dict[str, Any] = {"unit": " sentences"}
_BYTES: dict[str, Any] = {"unit": "B", "unit_scale": True, "unit_divisor": 1024}  # 1.5MB


class Progress:
    """Where a command draws the bars of its long steps (standard error by default), if at all.

    Library functions take one (``QUIET`` by default) and open a bar per step with
    :meth:`bar`; the command decides whether they are drawn.
    """

    def __init__(self, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.drawn = on_terminal(self.stream, enabled)

    @contextlib.contextmanager
    def bar(self, label: str, total: int, in_bytes: bool = False) -> Iterator[Advance]:
        """A bar labelled ``label`` counting to ``total`` sentences (or bytes) over the block,
        which gets its :data:`Advance` callback; the finished bar stays as a line. While it is
        drawn, console log lines are written above it."""
        if not self.drawn:
            yield no_progress
            return
        units = _BYTES if in_bytes else _SENTENCES
        with (
            logging_redirect_tqdm(),
            tqdm(total=total, desc=label, file=self.stream, dynamic_ncols=True, **units) as drawn,
        ):
            yield drawn.update

    @contextlib.contextmanager
    def steps(
        self, label: str, total: int, status: str, stream: TextIO | None = None
    ) -> Iterator[Any]:
        """A bar labelled ``label`` over ``total`` steps of work that reports its own position,
        drawn on ``stream`` (default: this one's) when :attr:`drawn`, starting with ``status``
        after its figures: the tqdm bar itself, whose ``n``, ``total`` and status
        (``set_postfix_str``) the caller sets, and whose ``write`` puts a line above it."""
        out = stream if stream is not None else self.stream
        with tqdm(
            total=total, desc=label, file=out, dynamic_ncols=True, unit=" steps", postfix=status
        ) as drawn:
            yield drawn


QUIET = Progress(enabled=False)  # draws nothing: the default of library functions

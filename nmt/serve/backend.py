"""What the server decodes with: the model of a package on one engine, loaded where its
decodes run (a process of its own for our search, the server's threads for CTranslate2)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from nmt.config import ConfigError
from nmt.data.multilingual import placement_of
from nmt.data.tokenizer import TokenizerPair
from nmt.decode.options import DecodeOptions
from nmt.environment import disable_mkl_fast_mm
from nmt.serve.languages import Languages
from nmt.store.package import CT2_DIR, is_package, read_package, verified_file

log = logging.getLogger(__name__)

DecodeFn = Callable[[list[list[int]], DecodeOptions, bool], list[Any]]


@dataclass
class Backend:
    """What the server decodes with: an engine's name, the tokenizers, a decode function
    (source ids without EOS -> outputs with ``tokens``, ``score``, ``nbest``, ``attention``)
    and the package's decoding defaults."""

    engine: str
    tokenizers: TokenizerPair
    decode: DecodeFn
    defaults: DecodeOptions
    model: str
    step: int
    concurrency: int = 1  # decodes it runs at once, each on a thread of its own
    languages: Languages = Languages((("src", "tgt"),))  # its directions and their tags
    max_positions: int | None = None  # source pieces the model reads, EOS included (None: any)


def languages_of(train_cfg: DictConfig, tokenizers: TokenizerPair, cfg: DictConfig) -> Languages:
    """The directions of a run's config (``data.directions``, or ``data.src_lang``/``tgt_lang``)
    with the tag ids of the tokenizer that reads them (``data.tag_placement``)."""
    data = train_cfg.get("data") or {}
    tokenizer = tokenizers.src if placement_of(data) == "source" else tokenizers.tgt
    return Languages.of(data, tokenizer.tags, bool(cfg.get("allow_zero_shot", False)))


def ct2_backend(cfg: DictConfig, package: Path) -> Backend:
    """The CTranslate2 engine on a package, without PyTorch."""
    # Intel MKL, inside CTranslate2's CPU build, keeps the memory of the largest batches in a
    # pool of its own; without it a long-running server gives that memory back (cpu_quick int8,
    # make bench-serve: 211 MiB at peak and 180 after the load test, against 244 and 196). MKL
    # reads it when it first allocates, so it is set before CTranslate2 is loaded.
    disable_mkl_fast_mm()
    from nmt.decode import ct2

    manifest, train_cfg, tokenizers = read_package(package)
    if manifest.ctranslate2 is None:
        raise ConfigError(
            f"engine=ctranslate2 needs a package exported with --format ctranslate2; {package} "
            "has no CTranslate2 model"
        )
    for name in manifest.files:
        if name.startswith(f"{CT2_DIR}/"):
            verified_file(package, manifest, name)
    languages = languages_of(train_cfg, tokenizers, cfg)
    max_positions = train_cfg.model.get("max_positions")
    engine = ct2.CTranslate2Engine(
        package / CT2_DIR,
        tokenizers,
        max_positions,
        cfg.device,
        threads=cfg.threads,
        suppress_start=bool(train_cfg.model.get("suppress_start", False)),
    )
    defaults = DecodeOptions.from_config(cfg, train_cfg.decode)
    # each worker takes a decode of its own: a worker that finishes its sentences starts on
    # the next ones at once, instead of waiting for the other worker's longer sentences; a
    # multilingual model's forced target tag (``forced=``) is CTranslate2's target_prefix
    decode = partial(engine.decode_ids, spread=False)
    return Backend(
        "ctranslate2",
        tokenizers,
        decode,
        defaults,
        str(package),
        manifest.step,
        engine.workers,
        languages,
        max_positions,
    )


def torch_backend(cfg: DictConfig) -> Backend:
    """Our search or, with ``engine=auto``, the engine measured faster for the package."""
    import torch

    from nmt.data.batching import TokenDataset
    from nmt.decode.engines import make_engine
    from nmt.runtime.device import setup_device
    from nmt.store.loading import decode_defaults, load_model

    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    device = setup_device(cfg.device, cfg.tf32)
    trained = load_model(cfg, device)
    defaults = DecodeOptions.from_config(cfg, decode_defaults(trained))
    engine = make_engine(cfg.engine, trained, defaults, device)

    def decode(
        sources: list[list[int]],
        opts: DecodeOptions,
        keep_attention: bool,
        forced: list[int] | None = None,
    ) -> list[Any]:
        data = TokenDataset(sources, [[] for _ in sources])
        if forced is not None:  # a multilingual model's target tag, as its first output token
            data.forced = np.asarray(forced, dtype=np.int64)
        outputs = engine.hypotheses(data, opts, keep_attention=keep_attention)
        # the answers are built on the event loop's thread, which never touches a tensor
        return [_without_tensors(o) for o in outputs]

    return Backend(
        engine.name,
        trained.tokenizers,
        decode,
        defaults,
        str(trained.path),
        trained.step,
        languages=languages_of(trained.cfg, trained.tokenizers, cfg),
        max_positions=(
            trained.model.max_positions  # None for a model without a position table
            if trained.model is not None
            else trained.cfg.model.get("max_positions")  # a CTranslate2-only package
        ),
    )


def start_backend(cfg: DictConfig) -> tuple[Backend, Executor]:
    """The backend, loaded where its decodes will run: our search in a child process
    (:class:`DecodeProcess`, unless ``decode_process=false``), CTranslate2 on the thread that
    loads it (:func:`decode_thread`), with as many threads as it runs decodes at once."""
    if cfg.decode_process and cfg.engine != "ctranslate2":
        process = DecodeProcess(cfg)
        try:
            return process.start(), process
        except BaseException:
            process.shutdown(wait=False)
            raise
    executor = decode_thread(nice=cfg.decode_nice)
    try:
        backend = executor.submit(load_backend, cfg).result()
    except BaseException:
        executor.shutdown(wait=False)
        raise
    if backend.concurrency > 1:  # CTranslate2: no PyTorch in the process
        executor.shutdown(wait=True)
        executor = decode_thread(backend.concurrency, cfg.decode_nice)
    return backend, executor


def _without_tensors(output: Any) -> Any:
    if output.attention is None or isinstance(output.attention, np.ndarray):
        return output
    return replace(output, attention=output.attention.numpy())


def load_backend(cfg: DictConfig) -> Backend:
    package = cfg.model_dir or (cfg.run if is_package(cfg.run) and not cfg.ckpt else None)
    if cfg.engine == "ctranslate2":
        if package is None:
            raise ConfigError("engine=ctranslate2 serves a model package: give model=DIR")
        return ct2_backend(cfg, Path(package))
    return torch_backend(cfg)


def decode_thread(threads: int = 1, nice: int = 0) -> ThreadPoolExecutor:
    """The one thread that loads the model and runs every decode (``threads`` for a backend
    that runs several decodes at once): CTranslate2's, or our search's with
    ``decode_process=false``.

    The event loop's thread (the main one) never runs a PyTorch operation: once the main thread
    has run one on a team of OpenMP threads, another thread's decodes keep only part of the
    cores busy. With the model loaded here, the server of a 2-core CPU went from 110 to 248
    sentences/s (cpu_quick, 32 clients, greedy; ``make bench-serve``).

    On Linux each thread is ``nice`` steps less urgent than the event loop's thread (the server's
    ``decode_nice``, 0 by default), and so are the threads it starts: PyTorch's OpenMP team and
    CTranslate2's workers, which are started by the thread that loads the model. Measured under
    4x overload (docs/bench/serving.md), 5 steps shortened the 503s a little but made the slowest
    /health answers slower, so it is off unless asked for.
    """
    return ThreadPoolExecutor(
        max_workers=threads,
        thread_name_prefix="nmt-decode",
        initializer=lower_priority,
        initargs=(nice,),
    )


def lower_priority(nice: int) -> None:
    """Make the calling thread (and the threads it will start) ``nice`` steps less urgent.

    Linux only: there a thread's niceness is its own, set through its thread id; elsewhere the
    call would reach the whole process (or another one), so nothing is done."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as e:  # a sandbox may forbid it: the server runs, less promptly under load
        log.warning("could not lower the decoding thread's priority: %s", e)


# The backend of a decoding process (:class:`DecodeProcess`), loaded by _load_in_child.
_CHILD_BACKEND: Backend | None = None


class DecodeProcess(Executor):
    """The process that loads the model and runs every decode of our search.

    Our search holds the interpreter's lock between its tensor operations, so on a thread of
    the server's process it delays the event loop: under 4x overload on a trained model, the
    503s' p99 was 72-90 ms and one ``/health`` probe in about 130 took 140-270 ms
    (docs/bench/serving.md). In a process of its own the search shares only the cores with the
    event loop. Sources go to it and outputs come back pickled (ids, scores and numpy
    attention: small beside a decode).

    The process ignores SIGINT and SIGTERM (the server's graceful stop, which a terminal or a
    service manager also sends to it, finishes the requests in flight first) and ends when the
    server shuts it down. If it dies (killed, out of memory), the decode it was running fails
    and the next one starts a new process, which loads the model again.
    """

    def __init__(self, cfg: DictConfig) -> None:
        from omegaconf import OmegaConf

        self._cfg = OmegaConf.to_container(cfg, resolve=True)
        self._lock = threading.Lock()
        self._pool = self._new_pool()
        self.restarts = 0

    def _new_pool(self) -> ProcessPoolExecutor:
        # spawn: a fresh interpreter, with no copy of the server's threads or event loop
        return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))

    def start(self) -> Backend:
        """Load the model in the process; the server's view of it (``decode`` runs there)."""
        return self._pool.submit(_load_in_child, self._cfg).result()

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        with self._lock:
            try:
                return self._pool.submit(fn, *args, **kwargs)
            except BrokenProcessPool:
                log.error("the decoding process ended; starting a new one")
                self._pool.shutdown(wait=False)
                self._pool = self._new_pool()
                self.restarts += 1
                # the new process loads the model before it takes the decode (one worker:
                # its tasks run in order)
                self._pool.submit(_load_in_child, self._cfg)
                return self._pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)

    def pid(self) -> int:
        """The decoding process's id (it is started if it had ended)."""
        return self.submit(os.getpid).result()


def _load_in_child(cfg: dict) -> Backend:
    """In the decoding process: load the backend; the server gets it with the decode function
    that runs here."""
    global _CHILD_BACKEND
    from omegaconf import OmegaConf

    from nmt.config import ServeConfig

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    serve_cfg = OmegaConf.merge(OmegaConf.structured(ServeConfig), cfg)
    lower_priority(serve_cfg.decode_nice)  # before PyTorch starts its threads
    _CHILD_BACKEND = torch_backend(serve_cfg)
    return replace(_CHILD_BACKEND, decode=_decode_in_child)


def _decode_in_child(
    sources: list[list[int]],
    opts: DecodeOptions,
    keep_attention: bool,
    forced: list[int] | None = None,
) -> list[Any]:
    """In the decoding process: the outputs of the backend loaded there, as plain data (a
    class of PyTorch's modules would import PyTorch in the server's process to unpickle)."""
    from nmt.decode.ct2 import Decoded

    if _CHILD_BACKEND is None:
        raise RuntimeError("the decoding process has no model loaded")
    outputs = _CHILD_BACKEND.decode(sources, opts, keep_attention, forced=forced)
    return [
        Decoded(
            [int(t) for t in o.tokens],
            float(o.score),
            o.attention,
            [([int(t) for t in tokens], float(score)) for tokens, score in o.nbest],
        )
        for o in outputs
    ]

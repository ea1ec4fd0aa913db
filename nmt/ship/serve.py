"""HTTP translation server over a model package: ``nmt-serve`` / ``make serve``.

::

    nmt-serve model=DIR [engine=auto|torch|ctranslate2] host=127.0.0.1 port=8080

Endpoints (JSON in and out):

* ``GET /health``: ``{"status": "ok", "engine", "model", "step", "decode", "limits",
  "requests", "batches", "sentences", "in_flight", "queued"}``;
* ``POST /translate`` with ``{"text": ["Ein Hund.", ...], "beam": 5, "length_penalty": 1.0,
  "n_best": 2, "attention": true}`` (all but ``text`` optional; the defaults are the package's
  decoding defaults) answers ``{"translations": [...], "scores": [...]}``, plus ``"n_best"``
  (per sentence, ``[{"text", "score"}]`` best first) when ``n_best`` > 1 and ``"attention"``
  (per sentence, ``{"source", "target", "weights"}``: pieces and one row per output token,
  EOS included) when asked for.

Requests are batched: a request that arrives while the model decodes, or within
``batch_wait_ms`` of the first one of a batch, shares a decode with the others that ask for the
same search (beam, length penalty, attention), up to ``max_batch_sentences`` sentences; each
gets its own sentences back. An engine with several workers (CTranslate2 on CPU) runs as many
decodes at once, and the waiting sentences are shared among its free workers.

Limits (``max_sentences`` per request, ``max_chars`` per sentence, ``max_body_bytes`` per
body, ``max_beam``) and malformed input (not UTF-8, not JSON, wrong types, empty lists,
unknown keys) get a 4xx answer with ``{"error": message}``; the server goes on serving.
SIGTERM or SIGINT stops it gracefully: it stops accepting connections, finishes the requests
in flight (up to ``shutdown_timeout`` seconds) and exits 0.

The web library is aiohttp: one well-kept package gives the asyncio server, request body limits
and graceful shutdown, and its client serves the load test. With ``engine=ctranslate2`` the
process never imports PyTorch: the package's config, tokenizers and CTranslate2 model are read by
torch-free code (:mod:`nmt.store.package`, :mod:`nmt.decode.ct2`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from omegaconf import DictConfig

from nmt.cli import config_dir, exit_on_error, setup_logging
from nmt.config import ConfigError, register_configs
from nmt.data.tokenizer import EOS_ID, TokenizerPair
from nmt.decode.options import DecodeOptions
from nmt.environment import disable_mkl_fast_mm
from nmt.store.package import CT2_DIR, is_package, model_argument, read_package, verified_file

log = logging.getLogger(__name__)
register_configs()

REQUEST_KEYS = ("text", "beam", "length_penalty", "n_best", "attention")

DecodeFn = Callable[[list[list[int]], DecodeOptions, bool], list[Any]]


def _require_aiohttp() -> Any:
    try:
        from aiohttp import web
    except ImportError:
        raise ConfigError(
            "nmt-serve needs aiohttp, which comes with the optional extra: pip install 'nmt[serve]'"
        ) from None
    return web


# ------------------------------------------------------------------------------- the model


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
    engine = ct2.CTranslate2Engine(
        package / CT2_DIR,
        tokenizers,
        train_cfg.model.get("max_positions"),
        "cuda" if cfg.device == "cuda" else "cpu",
        threads=cfg.threads,
    )
    defaults = DecodeOptions.from_config(cfg, train_cfg.decode)
    # each worker takes a decode of its own: a worker that finishes its sentences starts on
    # the next ones at once, instead of waiting for the other worker's longer sentences
    decode = partial(engine.decode_ids, spread=False)
    return Backend(
        "ctranslate2", tokenizers, decode, defaults, str(package), manifest.step, engine.workers
    )


def torch_backend(cfg: DictConfig) -> Backend:
    """Our search or, with ``engine=auto``, the engine measured faster for the package."""
    import torch

    from nmt.data.batching import TokenDataset
    from nmt.decode.engines import make_engine
    from nmt.runtime.device import pick_device
    from nmt.store.loading import decode_defaults, load_model

    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    device = pick_device(cfg.device)
    trained = load_model(cfg, device)
    defaults = DecodeOptions.from_config(cfg, decode_defaults(trained))
    engine = make_engine(cfg.engine, trained, defaults, device)

    def decode(sources: list[list[int]], opts: DecodeOptions, keep_attention: bool) -> list[Any]:
        data = TokenDataset(sources, [[] for _ in sources])
        outputs = engine.hypotheses(data, opts, keep_attention=keep_attention)
        # the answers are built on the event loop's thread, which never touches a tensor
        return [_without_tensors(o) for o in outputs]

    return Backend(
        engine.name, trained.tokenizers, decode, defaults, str(trained.path), trained.step
    )


def start_backend(cfg: DictConfig) -> tuple[Backend, ThreadPoolExecutor]:
    """The backend, loaded on the thread that will run its decodes (:func:`decode_thread`);
    a backend that runs several decodes at once gets as many threads."""
    executor = decode_thread()
    try:
        backend = executor.submit(load_backend, cfg).result()
    except BaseException:
        executor.shutdown(wait=False)
        raise
    if backend.concurrency > 1:  # CTranslate2: no PyTorch in the process
        executor.shutdown(wait=True)
        executor = decode_thread(backend.concurrency)
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


# ------------------------------------------------------------------------------- batching


@dataclass
class Job:
    sources: list[list[int]]
    key: tuple[int, float, bool]  # beam, length penalty, attention: what a decode shares
    future: asyncio.Future


def decode_thread(threads: int = 1) -> ThreadPoolExecutor:
    """The one thread that loads the model and runs every decode (``threads`` for a backend
    that runs several decodes at once).

    The event loop's thread (the main one) never runs a PyTorch operation: once the main thread
    has run one on a team of OpenMP threads, another thread's decodes keep only part of the
    cores busy. With the model loaded here, the server of a 2-core CPU went from 110 to 248
    sentences/s (cpu_quick, 32 clients, greedy; ``make bench-serve``).
    """
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="nmt-decode")


class Batcher:
    """Collects the sentences of concurrent requests into shared decodes.

    Up to ``backend.concurrency`` decodes run at once. For a free one, the worker takes the
    first waiting request, then every request already waiting or arriving within ``wait_s``,
    up to ``max_sentences`` sentences; with several decodes, up to an equal share of the
    sentences in the server (waiting or decoding), so that the decodes stay about equal and a
    lone request starts at once on an idle worker. Requests that arrive while every decode is
    busy wait for the next free one. Decodes run on ``executor`` (:func:`decode_thread`; a new
    one if not given). Counters: ``batches`` (decodes run), ``sentences``, ``requests``.
    """

    def __init__(
        self,
        backend: Backend,
        wait_s: float,
        max_sentences: int,
        executor: ThreadPoolExecutor | None = None,
    ) -> None:
        self.backend = backend
        self.wait_s = wait_s
        self.max_sentences = max_sentences
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.waiting = 0  # sentences in the queue
        self.executor = executor or decode_thread(backend.concurrency)
        self.batches = self.sentences = self.requests = 0
        self.slots = asyncio.Semaphore(backend.concurrency)  # one per decode that may run
        self.decoding = 0  # sentences the running decodes hold
        self.task: asyncio.Task | None = None
        self.decodes: set[asyncio.Task] = set()

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        for task in [self.task, *self.decodes]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self.executor.shutdown(wait=True)

    async def submit(self, sources: list[list[int]], opts: DecodeOptions, attention: bool) -> list:
        future = asyncio.get_running_loop().create_future()
        self.requests += 1
        self.waiting += len(sources)
        await self.queue.put(Job(sources, (opts.beam, opts.length_penalty, attention), future))
        return await future

    def _take(self, job: Job) -> Job:
        self.waiting -= len(job.sources)
        return job

    async def _collect(self) -> list[Job]:
        loop = asyncio.get_running_loop()
        jobs = [self._take(await self.queue.get())]
        count = len(jobs[0].sources)
        deadline = loop.time() + self.wait_s
        while count < self._limit(count):
            try:
                job = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self.queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
            jobs.append(self._take(job))
            count += len(job.sources)
        return jobs

    def _limit(self, count: int) -> int:
        """Sentences a new decode takes: all it can, or with several decodes its share of the
        sentences in the server (``count`` taken, those waiting and those decoding)."""
        slots = self.backend.concurrency
        if slots == 1:
            return self.max_sentences
        return min(self.max_sentences, -(-(count + self.waiting + self.decoding) // slots))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.slots.acquire()  # a decode may start: collect its requests
            jobs = await self._collect()
            groups: dict[tuple, list[Job]] = defaultdict(list)
            for job in jobs:
                groups[job.key].append(job)
            for i, (key, members) in enumerate(groups.items()):
                if i > 0:  # each further search waits for a slot of its own
                    await self.slots.acquire()
                self.decoding += sum(len(job.sources) for job in members)
                task = loop.create_task(self._decode(key, members))
                self.decodes.add(task)
                task.add_done_callback(self.decodes.discard)

    async def _decode(self, key: tuple[int, float, bool], members: list[Job]) -> None:
        beam, alpha, attention = key
        sources = [s for job in members for s in job.sources]
        opts = replace(self.backend.defaults, beam=beam, length_penalty=alpha)
        try:
            outputs = await asyncio.get_running_loop().run_in_executor(
                self.executor, self.backend.decode, sources, opts, attention
            )
        except Exception as e:  # the requests get a 500 with the reason; serving goes on
            log.exception("decoding failed")
            for job in members:
                if not job.future.done():
                    job.future.set_exception(e)
            return
        finally:
            self.decoding -= len(sources)
            self.slots.release()
        self.batches += 1
        self.sentences += len(sources)
        start = 0
        for job in members:
            part = outputs[start : start + len(job.sources)]
            start += len(job.sources)
            if not job.future.done():
                job.future.set_result(part)


# -------------------------------------------------------------------------------- requests


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _int(body: dict, key: str, low: int, high: int, default: int) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(400, f"'{key}' must be an integer, not {type(value).__name__}")
    if not low <= value <= high:
        raise BadRequest(400, f"'{key}'={value} must be between {low} and {high}")
    return value


@dataclass
class Limits:
    max_sentences: int
    max_chars: int
    max_body_bytes: int
    max_beam: int


def parse_request(raw: bytes, limits: Limits, defaults: DecodeOptions) -> dict[str, Any]:
    """The checked fields of a /translate body; :class:`BadRequest` naming the problem."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(400, f"the body is not valid UTF-8 (byte {e.start})") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRequest(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest(400, 'the body must be a JSON object such as {"text": ["..."]}')
    unknown = sorted(set(body) - set(REQUEST_KEYS))
    if unknown:
        raise BadRequest(400, f"unknown key(s) {unknown}; allowed: {list(REQUEST_KEYS)}")
    if "text" not in body:
        raise BadRequest(400, "'text' is missing: a list of sentences to translate")
    sentences = body["text"]
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
        raise BadRequest(400, "'text' must be a list of strings")
    if not sentences:
        raise BadRequest(400, "'text' is empty: give at least one sentence")
    if len(sentences) > limits.max_sentences:
        raise BadRequest(
            413, f"'text' has {len(sentences)} sentences; at most {limits.max_sentences}"
        )
    for i, sentence in enumerate(sentences):
        if len(sentence) > limits.max_chars:
            raise BadRequest(
                413, f"text[{i}] has {len(sentence)} characters; at most {limits.max_chars}"
            )
    beam = _int(body, "beam", 1, limits.max_beam, defaults.beam)
    n_best = _int(body, "n_best", 1, beam, 1)
    alpha = body.get("length_penalty", defaults.length_penalty)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 10:
        raise BadRequest(400, "'length_penalty' must be a number between 0 and 10")
    attention = body.get("attention", False)
    if not isinstance(attention, bool):
        raise BadRequest(400, "'attention' must be true or false")
    return {
        "text": [s.strip() for s in sentences],
        "beam": beam,
        "n_best": n_best,
        "length_penalty": float(alpha),
        "attention": attention,
    }


def attention_view(source: list[str], target: list[str], output: Any) -> dict[str, Any]:
    """Source and target pieces with one row of weights per output step: a row for EOS when
    the output ended with one (an output cut at its cap by CTranslate2 has none)."""
    if output.attention is None:
        return {"source": source, "target": target, "weights": None}
    weights = [[round(float(w), 5) for w in row] for row in output.attention]
    if len(weights) > len(target):
        target = [*target, "</s>"]
    return {"source": source, "target": target, "weights": weights}


def make_app(
    backend: Backend,
    cfg: DictConfig,
    state: dict[str, Any] | None = None,
    executor: ThreadPoolExecutor | None = None,
) -> Any:
    """The aiohttp application: /health and /translate over ``backend``, decoding on
    ``executor`` (the thread that loaded the backend). ``state`` (filled here) gives the caller
    the batcher and the counters of requests in flight and rejected."""
    web = _require_aiohttp()
    limits = Limits(cfg.max_sentences, cfg.max_chars, cfg.max_body_bytes, cfg.max_beam)
    batcher = Batcher(backend, cfg.batch_wait_ms / 1000.0, cfg.max_batch_sentences, executor)
    state = {} if state is None else state
    state.update(in_flight=0, rejected=0, batcher=batcher)
    src_tok, tgt_tok = backend.tokenizers.src, backend.tokenizers.tgt

    def error(status: int, message: str) -> Any:
        state["rejected"] += 1
        return web.json_response({"error": message}, status=status)

    async def health(request: Any) -> Any:
        return web.json_response(
            {
                "status": "ok",
                "engine": backend.engine,
                "model": backend.model,
                "step": backend.step,
                "decode": {
                    "beam": backend.defaults.beam,
                    "length_penalty": backend.defaults.length_penalty,
                },
                "limits": asdict(limits),
                "requests": batcher.requests,
                "batches": batcher.batches,
                "sentences": batcher.sentences,
                "rejected": state["rejected"],
                "in_flight": state["in_flight"],
                "queued": batcher.queue.qsize(),
                "pytorch_loaded": "torch" in sys.modules,
            }
        )

    async def translate(request: Any) -> Any:
        state["in_flight"] += 1
        try:
            if (
                request.content_length is not None
                and request.content_length > limits.max_body_bytes
            ):
                return error(
                    413,
                    f"the body has {request.content_length} bytes; at most {limits.max_body_bytes}",
                )
            try:
                raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                return error(413, f"the body is larger than {limits.max_body_bytes} bytes")
            try:
                req = parse_request(raw, limits, backend.defaults)
            except BadRequest as e:
                return error(e.status, str(e))
            sources = src_tok.encode_batch(req["text"])
            opts = replace(backend.defaults, beam=req["beam"], length_penalty=req["length_penalty"])
            try:
                outputs = await batcher.submit(sources, opts, req["attention"])
            except Exception as e:
                return web.json_response({"error": f"decoding failed: {e}"}, status=500)
            answer: dict[str, Any] = {
                "translations": [tgt_tok.decode(o.tokens) for o in outputs],
                "scores": [float(o.score) for o in outputs],
            }
            if req["n_best"] > 1:
                answer["n_best"] = [
                    [
                        {"text": tgt_tok.decode(t), "score": float(s)}
                        for t, s in o.nbest[: req["n_best"]]
                    ]
                    for o in outputs
                ]
            if req["attention"]:
                answer["attention"] = [
                    attention_view(src_tok.pieces([*ids, EOS_ID]), tgt_tok.pieces(o.tokens), o)
                    for ids, o in zip(sources, outputs, strict=True)
                ]
            return web.json_response(answer)
        finally:
            state["in_flight"] -= 1

    async def on_startup(app: Any) -> None:
        batcher.start()

    async def on_cleanup(app: Any) -> None:
        await batcher.stop()

    app = web.Application(client_max_size=limits.max_body_bytes)
    app.router.add_get("/health", health)
    app.router.add_post("/translate", translate)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


# -------------------------------------------------------------------------------- process


async def serve(
    cfg: DictConfig, backend: Backend, executor: ThreadPoolExecutor | None = None
) -> None:
    """Serve until SIGTERM or SIGINT, then finish the requests in flight and return."""
    web = _require_aiohttp()
    state: dict[str, Any] = {}
    app = make_app(backend, cfg, state, executor)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=cfg.shutdown_timeout)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # the real one when port=0
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(
        f"nmt-serve: {backend.model} (step {backend.step}, engine {backend.engine}) on "
        f"http://{cfg.host}:{port}",
        flush=True,
    )
    await stop.wait()
    in_flight = state["in_flight"]
    log.info("shutting down: %d request(s) in flight", in_flight)
    print(f"nmt-serve: shutting down, {in_flight} request(s) in flight", flush=True)
    await site.stop()  # no new connections
    # the requests in flight are answered before any connection is closed
    deadline = loop.time() + cfg.shutdown_timeout
    while state["in_flight"] and loop.time() < deadline:
        await asyncio.sleep(0.01)
    await runner.cleanup()  # close the connections, stop the batcher
    print(f"nmt-serve: stopped after {state['batcher'].requests} request(s)", flush=True)


def run(cfg: DictConfig) -> None:
    _require_aiohttp()
    for key in ("max_sentences", "max_chars", "max_body_bytes", "max_beam", "max_batch_sentences"):
        if cfg[key] < 1:
            raise ConfigError(f"{key}={cfg[key]} must be >= 1")
    if cfg.batch_wait_ms < 0 or cfg.shutdown_timeout < 0:
        raise ConfigError("batch_wait_ms and shutdown_timeout must be >= 0")
    start = time.perf_counter()
    backend, executor = start_backend(cfg)
    log.info("loaded %s in %.2fs", backend.model, time.perf_counter() - start)
    asyncio.run(serve(cfg, backend, executor))


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="serve")
def _main(cfg: DictConfig) -> None:
    setup_logging()
    with exit_on_error(log, OSError):  # OSError: e.g. the port is taken
        run(cfg)


def main(argv: Sequence[str] | None = None) -> None:
    sys.argv[1:] = model_argument(list(sys.argv[1:] if argv is None else argv))
    _main()


if __name__ == "__main__":
    main()

"""The aiohttp application: the endpoints over a backend and its batcher.

* ``GET /``: the page (:mod:`nmt.serve.page`);
* ``GET /health``: the engine, model, limits and counters; ``GET /ready``: whether the queue
  has room; ``GET /metrics``: Prometheus' text format (:mod:`nmt.serve.metrics`);
* ``POST /v1/translate``: our own API (:mod:`nmt.serve.native`);
* ``POST /translate``, ``GET /languages``: LibreTranslate's API (:mod:`nmt.serve.libre`);
* ``GET /openapi.json``: the OpenAPI 3 document of them all (:mod:`nmt.serve.openapi`).

Every request body is read as hostile (:func:`nmt.serve.native.load_json`): a malformed one
gets a 4xx with ``{"error": message}`` and the server goes on serving. A translation that finds
the queue full gets 503 with ``Retry-After``, one not answered by its deadline 504: the checks
around each translation request are :mod:`nmt.serve.guard`'s.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from nmt.config import ConfigError
from nmt.data.tokenizer import EOS_ID
from nmt.decode.languages import forced_tokens, tagged_sources
from nmt.serve import libre
from nmt.serve.access import OPEN_PATHS, authorize, check_origins, cors_middleware, key_middleware
from nmt.serve.backend import Backend
from nmt.serve.batcher import Batcher, Overloaded
from nmt.serve.guard import DecodeFailed, Guard
from nmt.serve.keys import KeyRing
from nmt.serve.languages import AUTO
from nmt.serve.metrics import Metrics
from nmt.serve.native import BadRequest, Limits, attention_view, parse_request
from nmt.serve.openapi import openapi_document
from nmt.serve.page import page_headers, render_page

# LibreTranslate's paths: its /translate takes the key in the body, its /languages needs none
LIBRE_PATHS = ("/translate", "/languages")

# a request of more sentences than this, or with attention or n-best lists, is tokenized and its
# answer built on a thread of its own: 64 long sentences take ~10 ms to tokenize and attention
# weights seconds to write, which on the event loop's thread would stall every other request
INLINE_SENTENCES = 4

# source ids as the model reads them, and the first output token of each (or None)
Encoded = tuple[list[list[int]], list[int] | None]


def require_aiohttp() -> Any:
    try:
        from aiohttp import web
    except ImportError:
        raise ConfigError(
            "nmt-serve needs aiohttp, which comes with the optional extra: pip install 'nmt[serve]'"
        ) from None
    return web


def limits_of(cfg: DictConfig) -> Limits:
    return Limits(
        cfg.max_sentences, cfg.max_chars, cfg.max_body_bytes, cfg.max_beam, cfg.max_segments
    )


def page_info(backend: Backend, limits: Limits, keys: bool) -> dict[str, Any]:
    """What the page says about the server (:func:`nmt.serve.page.render_page`)."""
    langs = backend.languages
    sources, choices = langs.sources, langs.source_choices
    return {
        "model": Path(backend.model).name,
        "step": backend.step,
        "engine": backend.engine,
        # one source language is named; a multilingual model reads any of its sources
        "src_lang": sources[0] if len(sources) == 1 else None,
        "targets": langs.targets,
        # the sources a request may name (several: the page offers them), and the targets of
        # each
        "sources": choices,
        "pairs": {source: langs.targets_of(source) for source in choices},
        "beam": backend.defaults.beam,
        "max_beam": limits.max_beam,
        "keys": keys,
    }


class Server:
    """The endpoints of ``nmt-serve`` over ``backend`` (model, tokenizers, languages), the
    ``batcher`` that shares its decodes, the ``guard`` of the translation requests (limits,
    deadline, counters), the ``metrics``, the key ring (None: no keys) and the CORS
    ``origins``. :meth:`build` makes them from the configuration, :meth:`application` the
    aiohttp application; ``stopping = True`` makes /ready answer 503."""

    def __init__(
        self,
        web: Any,
        backend: Backend,
        batcher: Batcher,
        guard: Guard,
        metrics: Metrics,
        ring: KeyRing | None = None,
        origins: list[str] | None = None,
    ) -> None:
        self.web = web
        self.backend = backend
        self.batcher = batcher
        self.guard = guard
        self.metrics = metrics
        self.ring = ring
        self.origins = origins or []
        self.limits = guard.limits
        self.stopping = False
        metrics.watch(batcher, lambda: guard.in_flight)
        self.document = openapi_document(self.limits, backend)
        # tokenizing big requests and writing big answers (INLINE_SENTENCES)
        self.helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nmt-text")
        self.html, self.policy = render_page(page_info(backend, self.limits, ring is not None))

    @classmethod
    def build(cls, backend: Backend, cfg: DictConfig, executor: Executor | None = None) -> Server:
        """The server of ``backend``, decoding on ``executor`` (where the backend was loaded:
        :func:`nmt.serve.backend.start_backend`), with the keys of ``api_keys_file`` and CORS
        for ``cors_origins``."""
        web = require_aiohttp()
        limits = limits_of(cfg)
        origins = check_origins(cfg.cors_origins)
        ring = KeyRing.load(cfg.api_keys_file) if cfg.api_keys_file else None
        metrics = Metrics()
        batcher = Batcher(
            backend,
            cfg.batch_wait_ms / 1000.0,
            cfg.max_batch_sentences,
            executor,
            max_queued=cfg.max_queued_sentences,
            hooks=metrics,
        )
        guard = Guard(web, limits, cfg.request_timeout)
        return cls(web, backend, batcher, guard, metrics, ring, origins)

    def application(self) -> Any:
        """The aiohttp application (one per server: it starts and stops the batcher)."""
        web = self.web
        middlewares = [self.metrics.middleware(web)]
        if self.origins:
            middlewares.append(cors_middleware(web, self.origins))
        if self.ring is not None:
            middlewares.append(key_middleware(web, self.ring, OPEN_PATHS | set(LIBRE_PATHS)))
        app = web.Application(client_max_size=self.limits.max_body_bytes, middlewares=middlewares)
        app.router.add_get("/", self.page)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.ready)
        app.router.add_get("/metrics", self.metrics_text)
        app.router.add_post(
            "/v1/translate", self.guard.endpoint(self.translate_v1, "decoding failed")
        )
        app.router.add_post(
            "/translate", self.guard.endpoint(self.translate_libre, "Cannot translate text")
        )
        app.router.add_get("/languages", self.languages)
        app.router.add_get("/openapi.json", self.openapi)
        app.on_startup.append(self.on_startup)
        app.on_cleanup.append(self.on_cleanup)
        return app

    async def on_startup(self, app: Any) -> None:
        self.batcher.start()

    async def on_cleanup(self, app: Any) -> None:
        await self.batcher.stop()
        self.helper.shutdown(wait=True)

    # ------------------------------------------------------------------ the server's state

    async def page(self, request: Any) -> Any:
        return self.web.Response(
            text=self.html,
            content_type="text/html",
            charset="utf-8",
            headers=page_headers(self.policy),
        )

    async def health(self, request: Any) -> Any:
        backend, batcher = self.backend, self.batcher
        return self.web.json_response(
            {
                "status": "ok",
                "engine": backend.engine,
                "model": backend.model,
                "step": backend.step,
                "languages": backend.languages.info(),
                "decode": {
                    "beam": backend.defaults.beam,
                    "length_penalty": backend.defaults.length_penalty,
                },
                "limits": {**asdict(self.limits), "max_positions": backend.max_positions},
                "requests": batcher.requests,
                "batches": batcher.batches,
                "sentences": batcher.sentences,
                "rejected": self.guard.rejected,
                "cancelled": batcher.cancelled,
                "in_flight": self.guard.in_flight,
                "queued": len(batcher.jobs),
                "queued_sentences": batcher.waiting,
                "max_queued_sentences": batcher.max_queued,
                "pytorch_loaded": "torch" in sys.modules,
            }
        )

    async def ready(self, request: Any) -> Any:
        batcher = self.batcher
        reason = None
        if self.stopping:
            reason = "the server is shutting down"
        elif batcher.task is None or batcher.task.done():
            reason = "the model is not serving"
        elif batcher.room() <= 0:
            reason = f"the queue is full: {batcher.waiting} sentences wait"
        if reason is None:
            return self.web.json_response({"status": "ready"})
        return self.web.json_response({"status": "not ready", "reason": reason}, status=503)

    async def metrics_text(self, request: Any) -> Any:
        body, content_type = self.metrics.text()
        response = self.web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    async def languages(self, request: Any) -> Any:
        return self.web.json_response(libre.language_list(self.backend.languages))

    async def openapi(self, request: Any) -> Any:
        return self.web.json_response(self.document)

    # ------------------------------------------------------------------ translation

    async def off_loop(self, heavy: bool, fn: Callable, *args: Any) -> Any:
        if not heavy:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.helper, fn, *args)

    def encode(
        self, texts: list[str], where: list[str], pair: tuple[str, str], prefix: str = ""
    ) -> Encoded:
        """Source ids as the model reads them for ``pair`` (source, target; with the tags
        where the model takes them), each within the model's position table (EOS included),
        and the first output token of each when the model is made to begin with the target's
        tag."""
        direction = self.backend.languages.target(pair[1], pair[0])
        ids = tagged_sources(self.backend.tokenizers.src.encode_batch(texts), direction)
        first = forced_tokens(len(ids), direction)
        forced = None if first is None else first.tolist()
        most = self.backend.max_positions
        for name, sentence in zip(where, ids, strict=True):
            if most is not None and len(sentence) + 1 > most:
                raise BadRequest(
                    413 if not prefix else 400,
                    f"{prefix}{name} is {len(sentence)} subword pieces long; this model reads at "
                    f"most {most - 1} (model.max_positions={most} counts the end of sentence)",
                )
        return ids, forced

    async def decode(
        self, deadline: float, encoded: Encoded, beam: int, alpha: float, attention: bool
    ) -> list:
        """The outputs of ``encoded`` (:meth:`encode`'s), by the request's deadline;
        :class:`DecodeFailed` when the engine fails (:class:`Overloaded` and ``TimeoutError``
        reach the guard as they are)."""
        opts = replace(self.backend.defaults, beam=beam, length_penalty=alpha)
        sources, forced = encoded
        try:
            return await self.batcher.submit(sources, opts, attention, deadline, forced)
        except (Overloaded, TimeoutError):
            raise
        except Exception as e:  # whatever the engine raises: a 500 (the guard's)
            raise DecodeFailed(str(e)) from e

    def prepare_v1(self, raw: bytes) -> tuple[dict[str, Any], Encoded]:
        req = parse_request(raw, self.limits, self.backend.defaults)
        pair = self.backend.languages.check(req["source"], req["target"])
        self.batcher.check_room(len(req["text"]))  # refused before the work of tokenizing
        where = [f"text[{i}]" for i in range(len(req["text"]))]
        return req, self.encode(req["text"], where, pair)

    def answer_v1(self, req: dict[str, Any], encoded: Encoded, outputs: list) -> bytes:
        src_tok, tgt_tok = self.backend.tokenizers.src, self.backend.tokenizers.tgt
        body: dict[str, Any] = {
            "translations": [tgt_tok.decode(o.tokens) for o in outputs],
            "scores": [float(o.score) for o in outputs],
        }
        n_best = req["n_best"]
        if n_best > 1:
            body["n_best"] = [
                [{"text": tgt_tok.decode(t), "score": float(s)} for t, s in o.nbest[:n_best]]
                for o in outputs
            ]
        if req["attention"]:
            body["attention"] = [
                attention_view(src_tok.pieces([*ids, EOS_ID]), tgt_tok.pieces(o.tokens), o)
                for ids, o in zip(encoded[0], outputs, strict=True)
            ]
        return json.dumps(body).encode()

    async def translate_v1(self, request: Any, deadline: float) -> Any:
        # our API reads any Content-Type as JSON (curl -d sends a form's)
        raw = await self.guard.json_body(request)
        # a body of more than a few short sentences is parsed and tokenized off the loop
        req, encoded = await self.off_loop(len(raw) > 2048, self.prepare_v1, raw)
        outputs = await self.decode(
            deadline, encoded, req["beam"], req["length_penalty"], req["attention"]
        )
        heavy = len(outputs) > INLINE_SENTENCES or req["attention"] or req["n_best"] > 1
        body = await self.off_loop(heavy, self.answer_v1, req, encoded, outputs)
        return self.web.Response(body=body, content_type="application/json")

    async def translate_libre(self, request: Any, deadline: float) -> Any:
        backend = self.backend
        fields = await self.guard.libre_fields(request)
        req = libre.parse_libre(fields, self.limits, backend.languages)
        # LibreTranslate's clients send their key in the body (our header is read too)
        if self.ring is not None:
            authorize(self.ring, request.headers, req.api_key)
        plan = libre.plan(req, self.limits)
        self.batcher.check_room(len(plan.sentences))  # refused before the work of tokenizing
        heavy = len(plan.sentences) > INLINE_SENTENCES
        pair = backend.languages.check(req.source, req.target)
        encoded = await self.off_loop(
            heavy, self.encode, plan.sentences, plan.where, pair, "Invalid request: "
        )
        count = req.alternatives + 1 if req.format == "text" else 1  # none for html
        beam = max(backend.defaults.beam, count)
        hypotheses: list[list[str]] = []
        if encoded[0]:
            outputs = await self.decode(
                deadline, encoded, beam, backend.defaults.length_penalty, False
            )
            tgt_tok = backend.tokenizers.tgt
            for o in outputs:
                best = [tgt_tok.decode(o.tokens)]
                hypotheses.append(best + [tgt_tok.decode(t) for t, _ in o.nbest[1:count]])
        detected = None if pair[0] == AUTO else pair[0]  # a multilingual model detects nothing
        return self.web.json_response(libre.answer(req, plan, hypotheses, detected))


def make_app(backend: Backend, cfg: DictConfig, executor: Executor | None = None) -> Any:
    """The aiohttp application of :meth:`Server.build`'s server over ``backend``."""
    return Server.build(backend, cfg, executor).application()

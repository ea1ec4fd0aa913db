"""The aiohttp application: the endpoints over a backend and its batcher."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from nmt.config import ConfigError
from nmt.data.tokenizer import EOS_ID
from nmt.serve.access import check_origins, cors_middleware, key_middleware
from nmt.serve.backend import Backend
from nmt.serve.batcher import Batcher
from nmt.serve.keys import KeyRing
from nmt.serve.native import BadRequest, Limits, attention_view, parse_request
from nmt.serve.page import page_headers, render_page


def require_aiohttp() -> Any:
    try:
        from aiohttp import web
    except ImportError:
        raise ConfigError(
            "nmt-serve needs aiohttp, which comes with the optional extra: pip install 'nmt[serve]'"
        ) from None
    return web


def make_app(
    backend: Backend,
    cfg: DictConfig,
    state: dict[str, Any] | None = None,
    executor: ThreadPoolExecutor | None = None,
) -> Any:
    """The aiohttp application: the page at /, /health and /translate over ``backend``,
    decoding on ``executor`` (the thread that loaded the backend), with the keys of
    ``api_keys_file`` and CORS for ``cors_origins``. ``state`` (filled here) gives the caller
    the batcher and the counters of requests in flight and rejected."""
    web = require_aiohttp()
    origins = check_origins(cfg.cors_origins)
    ring = KeyRing.load(cfg.api_keys_file) if cfg.api_keys_file else None
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

    html, policy = render_page(
        {
            "model": Path(backend.model).name,
            "step": backend.step,
            "engine": backend.engine,
            "src_lang": backend.languages[0],
            "tgt_lang": backend.languages[1],
            "beam": backend.defaults.beam,
            "max_beam": limits.max_beam,
            "keys": ring is not None,
        }
    )

    async def page(request: Any) -> Any:
        return web.Response(
            text=html, content_type="text/html", charset="utf-8", headers=page_headers(policy)
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

    middlewares = []
    if origins:
        middlewares.append(cors_middleware(web, origins))
    if ring is not None:
        middlewares.append(key_middleware(web, ring))
    app = web.Application(client_max_size=limits.max_body_bytes, middlewares=middlewares)
    app.router.add_get("/", page)
    app.router.add_get("/health", health)
    app.router.add_post("/translate", translate)
    app.router.add_post("/v1/translate", translate)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app

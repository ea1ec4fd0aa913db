"""The server's process: ``nmt-serve`` starts it, SIGTERM or SIGINT stops it gracefully."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Executor

import hydra
from omegaconf import DictConfig

from nmt.cli import config_dir, exit_on_error, setup_logging
from nmt.config import ConfigError, register_configs
from nmt.serve.access import check_exposure, check_origins
from nmt.serve.app import Server, require_aiohttp
from nmt.serve.backend import Backend, start_backend
from nmt.serve.keys import KeyRing
from nmt.store.package import model_argument

log = logging.getLogger(__name__)
register_configs()


async def serve(cfg: DictConfig, backend: Backend, executor: Executor | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then finish the requests in flight and return."""
    web = require_aiohttp()
    from nmt.serve.protocol import JsonErrorRunner  # aiohttp's, once it is known to be there

    server = Server.build(backend, cfg, executor)
    app = server.application()
    # handler_cancellation: a request whose client disconnects has its handler cancelled, so
    # that it leaves the queue undecoded (aiohttp's default since 3.8.6 is to let it run on)
    runner = JsonErrorRunner(
        app,
        handle_signals=False,
        shutdown_timeout=cfg.shutdown_timeout,
        handler_cancellation=True,
    )
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
    server.stopping = True  # /ready answers 503 from now on
    in_flight = server.guard.in_flight
    log.info("shutting down: %d request(s) in flight", in_flight)
    print(f"nmt-serve: shutting down, {in_flight} request(s) in flight", flush=True)
    await site.stop()  # no new connections
    # the requests in flight are answered before any connection is closed
    deadline = loop.time() + cfg.shutdown_timeout
    while server.guard.in_flight and loop.time() < deadline:
        await asyncio.sleep(0.01)
    await runner.cleanup()  # close the connections, stop the batcher
    print(f"nmt-serve: stopped after {server.batcher.requests} request(s)", flush=True)


def check_config(cfg: DictConfig) -> None:
    """:class:`ConfigError` naming the first field out of its range."""
    for key in (
        "max_sentences",
        "max_chars",
        "max_body_bytes",
        "max_beam",
        "max_batch_sentences",
        "max_queued_sentences",
        "max_segments",
    ):
        if cfg[key] < 1:
            raise ConfigError(f"{key}={cfg[key]} must be >= 1")
    if cfg.batch_wait_ms < 0 or cfg.shutdown_timeout < 0:
        raise ConfigError("batch_wait_ms and shutdown_timeout must be >= 0")
    if cfg.request_timeout <= 0:
        raise ConfigError(f"request_timeout={cfg.request_timeout} must be > 0 (seconds)")
    if cfg.sampling_topk != 1:
        raise ConfigError(
            f"sampling_topk={cfg.sampling_topk}: nmt-serve answers with searched translations; "
            "random sampling (back-translation) is nmt-translate's and nmt-eval's"
        )
    if cfg.max_queued_sentences < cfg.max_sentences:
        raise ConfigError(
            f"max_queued_sentences={cfg.max_queued_sentences} must be >= max_sentences="
            f"{cfg.max_sentences}: a request of max_sentences would never fit in the queue"
        )


def run(cfg: DictConfig) -> None:
    require_aiohttp()
    check_config(cfg)
    check_exposure(cfg)
    check_origins(cfg.cors_origins)
    if cfg.api_keys_file:
        KeyRing.load(cfg.api_keys_file)  # a bad file is named before the model loads
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

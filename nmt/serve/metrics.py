"""``GET /metrics``: the server's counters in Prometheus' text format (the ``prometheus-client``
package of the ``serve`` extra), one registry per application.

Counted through an aiohttp middleware (every request: its endpoint, status and latency) and the
batcher's hooks (decodes, their sentences and time; requests that left the queue undecoded):

* ``nmt_http_requests_total{endpoint, status}``: requests answered; status ``499`` for a
  request whose client went away before its answer;
* ``nmt_http_request_seconds{endpoint}``: latency histogram;
* ``nmt_sentences_total``: sentences decoded; ``nmt_batch_sentences``: sentences per decode
  (histogram); ``nmt_decode_seconds``: time of a decode (histogram);
* ``nmt_queued_sentences``, ``nmt_queued_requests``, ``nmt_in_flight_requests``: now;
* ``nmt_rejected_requests_total{reason}``: translation requests (POST) refused:
  ``overloaded`` (503, the queue is full), ``deadline`` (504), ``invalid`` (400),
  ``too_large`` (413), ``failed`` (500);
* ``nmt_cancelled_requests_total{reason}``: requests that left the queue undecoded:
  ``disconnected`` (the client went away) or ``deadline``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nmt.config import ConfigError

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# the statuses of refusals by the reason counted
REASONS = {503: "overloaded", 504: "deadline", 400: "invalid", 413: "too_large", 500: "failed"}
# nginx's "client closed request": the handler was cancelled when its client went away
CLIENT_GONE = "499"


def require_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError(
            "nmt-serve needs prometheus-client, which comes with the optional extra: "
            "pip install 'nmt[serve]'"
        ) from None
    return prometheus_client


class Metrics:
    """The counters of one application, in a registry of their own (so that several
    applications in one process, as in the tests, count apart)."""

    def __init__(self) -> None:
        prom = require_prometheus()
        self.prom = prom
        self.registry = r = prom.CollectorRegistry()
        self.requests = prom.Counter(
            "nmt_http_requests", "HTTP requests answered", ["endpoint", "status"], registry=r
        )
        self.latency = prom.Histogram(
            "nmt_http_request_seconds",
            "Time from a request's arrival to its answer",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.sentences = prom.Counter("nmt_sentences", "Sentences decoded", registry=r)
        self.batch_sentences = prom.Histogram(
            "nmt_batch_sentences", "Sentences per decode", buckets=BATCH_BUCKETS, registry=r
        )
        self.decode_seconds = prom.Histogram(
            "nmt_decode_seconds", "Time of one decode", buckets=LATENCY_BUCKETS, registry=r
        )
        self.rejected = prom.Counter(
            "nmt_rejected_requests", "Requests refused, by reason", ["reason"], registry=r
        )
        self.cancelled_requests = prom.Counter(
            "nmt_cancelled_requests",
            "Requests that left the queue undecoded, by reason",
            ["reason"],
            registry=r,
        )
        self.queued_sentences = prom.Gauge(
            "nmt_queued_sentences", "Sentences waiting for a decode", registry=r
        )
        self.queued_requests = prom.Gauge(
            "nmt_queued_requests", "Requests waiting for a decode", registry=r
        )
        self.in_flight = prom.Gauge(
            "nmt_in_flight_requests", "Translation requests being handled", registry=r
        )
        for reason in REASONS.values():  # every series exists from the start, at 0
            self.rejected.labels(reason)
        for reason in ("disconnected", "deadline"):
            self.cancelled_requests.labels(reason)

    def watch(self, batcher: Any, in_flight: Callable[[], int]) -> None:
        """The gauges read the batcher, and ``in_flight()`` the requests being handled, when
        scraped."""
        self.queued_sentences.set_function(lambda: batcher.waiting)
        self.queued_requests.set_function(lambda: len(batcher.jobs))
        self.in_flight.set_function(in_flight)

    # the batcher's hooks
    def decoded(self, sentences: int, seconds: float) -> None:
        self.sentences.inc(sentences)
        self.batch_sentences.observe(sentences)
        self.decode_seconds.observe(seconds)

    def cancelled(self, reason: str) -> None:
        self.cancelled_requests.labels(reason).inc()

    def text(self) -> tuple[bytes, str]:
        """The exposition and its content type."""
        return self.prom.generate_latest(self.registry), self.prom.CONTENT_TYPE_LATEST

    def middleware(self, web: Any) -> Callable:
        """Counts every request by endpoint (the route's path, ``other`` for none) and status."""

        @web.middleware
        async def count(request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
            start = time.perf_counter()
            resource = request.match_info.route.resource
            endpoint = resource.canonical if resource is not None else "other"
            status = "500"
            try:
                response = await handler(request)
                status = str(response.status)
                return response
            except web.HTTPException as e:
                status = str(e.status)
                raise
            except asyncio.CancelledError:
                status = CLIENT_GONE
                raise
            finally:
                self.requests.labels(endpoint, status).inc()
                self.latency.labels(endpoint).observe(time.perf_counter() - start)
                reason = REASONS.get(int(status))
                if reason is not None and request.method == "POST":  # not /ready's 503
                    self.rejected.labels(reason).inc()

        return count

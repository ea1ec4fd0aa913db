"""The HTTP translation server over a model package: ``nmt-serve`` / ``make serve``.

::

    nmt-serve model=DIR [engine=auto|torch|ctranslate2] host=127.0.0.1 port=8080

Endpoints (JSON in and out):

* ``GET /health``: ``{"status": "ok", "engine", "model", "step", "decode", "limits",
  "requests", "batches", "sentences", "in_flight", "queued"}``;
* ``GET /ready``: ``{"status": "ready"}``, or 503 with a ``reason`` while the queue is full or
  the server is stopping; ``GET /metrics``: Prometheus' text format (:mod:`~nmt.serve.metrics`);
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
At most ``max_queued_sentences`` sentences wait for a decode: a request beyond gets 503 with
``Retry-After`` at once; one not answered within ``request_timeout`` gets 504; a request whose
client disconnects (or whose deadline passes) leaves the queue undecoded, and a decode of many
sentences stops between its calls for the requests that left.
SIGTERM or SIGINT stops it gracefully: it stops accepting connections, finishes the requests
in flight (up to ``shutdown_timeout`` seconds) and exits 0.

The web library is aiohttp: one well-kept package gives the asyncio server, request body limits
and graceful shutdown, and its client serves the load test. With ``engine=ctranslate2`` the
process never imports PyTorch: the package's config, tokenizers and CTranslate2 model are read by
torch-free code (:mod:`nmt.store.package`, :mod:`nmt.decode.ct2`).

Modules: :mod:`~nmt.serve.backend` (the model and the threads that decode with it),
:mod:`~nmt.serve.batcher` (concurrent requests into shared decodes, the bounded queue),
:mod:`~nmt.serve.metrics` (``/metrics``), :mod:`~nmt.serve.native`
(the checks of our own request body), :mod:`~nmt.serve.app` (the aiohttp application) and
:mod:`~nmt.serve.main` (the process: start, signals, graceful stop). May import every layer up
to :mod:`nmt.decode`; nothing but :mod:`nmt.bench` and :mod:`nmt.docs` imports it.
"""

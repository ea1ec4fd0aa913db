"""The HTTP translation server over a model package: ``nmt-serve`` / ``make serve``.

::

    nmt-serve model=DIR [engine=auto|torch|ctranslate2] host=127.0.0.1 port=8080

Endpoints (JSON in and out):

* ``GET /``: a page to try the model in a browser (:mod:`~nmt.serve.page`);
* ``GET /health``: ``{"status": "ok", "engine", "model", "step", "languages", "decode",
  "limits", "requests", "batches", "sentences", "in_flight", "queued"}``;
* ``POST /v1/translate`` (our own API) with ``{"text": ["Ein Hund.", ...], "beam": 5,
  "length_penalty": 1.0, "n_best": 2, "attention": true}`` (all but ``text`` optional; the
  defaults are the package's decoding defaults) answers ``{"translations": [...], "scores":
  [...]}``, plus ``"n_best"`` (per sentence, ``[{"text", "score"}]`` best first) when ``n_best``
  > 1 and ``"attention"`` (per sentence, ``{"source", "target", "weights"}``: pieces and one row
  per output token, EOS included) when asked for;
* ``GET /ready``: ``{"status": "ready"}``, or 503 with a ``reason`` while the queue is full or
  the server is stopping; ``GET /metrics``: Prometheus' text format (:mod:`~nmt.serve.metrics`);
* ``POST /translate`` and ``GET /languages``: LibreTranslate's API (:mod:`~nmt.serve.libre`);
* ``GET /openapi.json``: the OpenAPI 3 document of them all (:mod:`~nmt.serve.openapi`).

Requests are batched: a request that arrives while the model decodes, or within
``batch_wait_ms`` of the first one of a batch, shares a decode with the others that ask for the
same search (beam, length penalty, attention), up to ``max_batch_sentences`` sentences; each
gets its own sentences back. An engine with several workers (CTranslate2 on CPU) runs as many
decodes at once, and the waiting sentences are shared among its free workers.

Limits (``max_sentences`` per request, ``max_chars`` per sentence, ``max_body_bytes`` per
body, ``max_beam``, the model's position table) and malformed input (every byte is read as
hostile: not UTF-8, not JSON, too deep, huge or non-finite numbers, keys given twice, lone
surrogates, wrong types, empty lists, unknown keys) get a 4xx answer with ``{"error":
message}``; the server goes on serving.
At most ``max_queued_sentences`` sentences wait for a decode: a request beyond gets 503 with
``Retry-After`` at once; one not answered within ``request_timeout`` gets 504; a request whose
client disconnects (or whose deadline passes) leaves the queue undecoded, and a decode of many
sentences stops between its calls for the requests that left.
SIGTERM or SIGINT stops it gracefully: it stops accepting connections, finishes the requests
in flight (up to ``shutdown_timeout`` seconds) and exits 0.

With ``api_keys_file`` every endpoint but the page, ``/health``, ``/ready``, ``/metrics``,
``/openapi.json`` and ``/languages`` needs a key of the file (``Authorization: Bearer KEY`` or
``X-API-Key``; LibreTranslate's ``/translate`` also takes its body's ``api_key``): 403 without
one, 429 past its limit. Without a keys file the
server listens on loopback only, unless ``allow_open=true``. ``cors_origins`` lists the web
origins whose pages may call it (:mod:`~nmt.serve.access`, :mod:`~nmt.serve.keys`).

The web library is aiohttp: one well-kept package gives the asyncio server, request body limits
and graceful shutdown, and its client serves the load test. With ``engine=ctranslate2`` the
process never imports PyTorch: the package's config, tokenizers and CTranslate2 model are read by
torch-free code (:mod:`nmt.store.package`, :mod:`nmt.decode.ct2`).

Modules: :mod:`~nmt.serve.backend` (the model and the threads that decode with it),
:mod:`~nmt.serve.batcher` (concurrent requests into shared decodes, the bounded queue),
:mod:`~nmt.serve.metrics` (``/metrics``), :mod:`~nmt.serve.native`
(the reading of a JSON body and the checks of our own), :mod:`~nmt.serve.libre`
(LibreTranslate's API) with :mod:`~nmt.serve.markup` (its html), :mod:`~nmt.serve.openapi`
(the OpenAPI document), :mod:`~nmt.serve.keys` (API keys and their limits),
:mod:`~nmt.serve.access` (keys on requests, exposure, CORS), :mod:`~nmt.serve.page` (the
page), :mod:`~nmt.serve.guard` (the checks around each translation request: body size,
deadline, refusals), :mod:`~nmt.serve.app` (the aiohttp application) and
:mod:`~nmt.serve.main` (the process: start, signals, graceful stop). May import every layer up
to :mod:`nmt.decode`; nothing in the package imports
it.
"""

"""The OpenAPI 3 document of the server (``GET /openapi.json``), built from the limits the
server enforces and the package's languages, so that it cannot drift from them.

It describes every endpoint of ``nmt-serve``: ours (``/health``, ``/v1/translate``),
LibreTranslate's (``/translate``, ``/languages``), this document, and the readiness, metrics and
web page endpoints (``/ready``, ``/metrics``, ``/``), with the answers of overload (503 with
Retry-After), of a passed deadline (504), of a refused API key (403) and of a rate limit (429).
"""

from __future__ import annotations

from typing import Any

from nmt.serve.languages import AUTO, Languages
from nmt.serve.native import Limits

OPENAPI_VERSION = "3.0.3"


def _error(description: str, headers: dict | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    if headers:
        answer["headers"] = headers
    return answer


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


# the answers that a translate endpoint may give besides its own
TRANSLATE_ERRORS = {
    "403": _error("The API key is refused (a server with API keys)."),
    "413": _error("The body, a list or a sentence is over a limit (the message names which)."),
    "415": _error("The Content-Type or charset is not one this endpoint reads."),
    "429": _error("Too many requests from this client (a server with rate limits)."),
    "500": _error("The decode failed (the message says why); the server goes on serving."),
    "503": _error(
        "The queue is full: come back later.",
        {
            "Retry-After": {
                "description": "Seconds to wait before trying again.",
                "schema": {"type": "integer", "minimum": 0},
            }
        },
    ),
    "504": _error("The request waited past its deadline before it could be decoded."),
}


def _native_answer() -> dict[str, Any]:
    """The schema of our API's answer."""
    hypothesis = {
        "type": "object",
        "required": ["text", "score"],
        "properties": {"text": {"type": "string"}, "score": {"type": "number"}},
    }
    attention = {
        "type": "object",
        "required": ["source", "target", "weights"],
        "properties": {
            "source": {"type": "array", "items": {"type": "string"}},
            "target": {"type": "array", "items": {"type": "string"}},
            "weights": {
                "type": "array",
                "nullable": True,
                "items": {"type": "array", "items": {"type": "number"}},
                "description": "One row per output token (EOS included), over the source.",
            },
        },
    }
    return {
        "type": "object",
        "required": ["translations", "scores"],
        "properties": {
            "translations": {"type": "array", "items": {"type": "string"}},
            "scores": {"type": "array", "items": {"type": "number"}},
            "n_best": {"type": "array", "items": {"type": "array", "items": hypothesis}},
            "attention": {"type": "array", "items": attention},
        },
    }


def _native(limits: Limits, defaults: Any, languages: Languages) -> dict[str, Any]:
    sentences = {
        "type": "array",
        "minItems": 1,
        "maxItems": limits.max_sentences,
        "items": {"type": "string", "maxLength": limits.max_chars},
        "description": "The sentences to translate (not empty nor only whitespace, no NUL).",
    }
    request = {
        "type": "object",
        "required": ["text"],
        "additionalProperties": False,
        "properties": {
            "text": sentences,
            "source": {
                "type": "string",
                "enum": [AUTO, *languages.source_choices],
                "default": AUTO,
                "description": "The source language (auto: any the model reads).",
            },
            "target": {
                "type": "string",
                "enum": languages.targets,
                "description": "The target language; needed when the model has several.",
            },
            "beam": {
                "type": "integer",
                "minimum": 1,
                "maximum": limits.max_beam,
                "default": defaults.beam,
                "description": "Beam size (1: greedy search).",
            },
            "length_penalty": {
                "type": "number",
                "minimum": 0,
                "maximum": 10,
                "default": defaults.length_penalty,
            },
            "n_best": {
                "type": "integer",
                "minimum": 1,
                "maximum": limits.max_beam,
                "default": 1,
                "description": "Hypotheses per sentence, best first (at most the beam).",
            },
            "attention": {"type": "boolean", "default": False},
        },
    }
    return {
        "post": {
            "summary": "Translate sentences (our own API).",
            "operationId": "translate_v1",
            "requestBody": {
                "required": True,
                "description": "Read as JSON (UTF-8) whatever its Content-Type.",
                "content": {"application/json": {"schema": request}},
            },
            "responses": {
                "200": _json(_native_answer(), "The translations, in the order of the sentences."),
                "400": _error("A malformed body or field (the message names it)."),
                **TRANSLATE_ERRORS,
            },
        }
    }


def _libre(limits: Limits, languages: Languages) -> dict[str, Any]:
    text = {"type": "string", "maxLength": limits.max_chars}
    fields: dict[str, Any] = {
        "source": {
            "type": "string",
            "enum": [AUTO, *languages.source_choices],
            "description": "The source language code (auto: any the model reads).",
        },
        "target": {"type": "string", "enum": languages.targets},
        "format": {"type": "string", "enum": ["text", "html"], "default": "text"},
        "alternatives": {
            "type": "integer",
            "minimum": 0,
            "maximum": limits.max_beam - 1,
            "default": 0,
            "description": "Translations to give beyond the best (none for html).",
        },
        "api_key": {"type": "string"},
    }
    request = {
        "type": "object",
        "required": ["q", "source", "target"],
        "properties": {
            "q": {
                "oneOf": [
                    {**text, "minLength": 1},
                    {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": limits.max_sentences,
                        "items": text,
                    },
                ],  # fmt: skip
                "description": (
                    f"Text(s) to translate: each line, or text node of html, a sentence (at "
                    f"most {limits.max_segments} in a request)."
                ),
            },
            **fields,
        },
    }
    form = {
        "type": "object",
        "required": ["q", "source", "target"],
        "properties": {"q": {**text, "minLength": 1}, **fields},
    }
    detected = {
        "type": "object",
        "required": ["confidence", "language"],
        "properties": {
            "confidence": {"type": "number", "minimum": 0, "maximum": 100},
            "language": {"type": "string"},
        },
    }
    strings = {"type": "array", "items": {"type": "string"}}
    answer = {
        "type": "object",
        "required": ["translatedText"],
        "properties": {
            "translatedText": {"oneOf": [{"type": "string"}, strings]},
            "alternatives": {"anyOf": [strings, {"type": "array", "items": strings}]},
            "detectedLanguage": {"oneOf": [detected, {"type": "array", "items": detected}]},
        },
    }
    return {
        "post": {
            "summary": "Translate text (LibreTranslate's API).",
            "operationId": "translate_libre",
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": request},
                    "application/x-www-form-urlencoded": {"schema": form},
                    "multipart/form-data": {"schema": form},
                },
            },
            "responses": {
                "200": _json(answer, "The translation(s): a list for a list."),
                "400": _error(
                    "A missing or malformed field, an unsupported language or format "
                    "(LibreTranslate's messages)."
                ),
                **TRANSLATE_ERRORS,
            },
        }
    }


def _server_paths() -> dict[str, Any]:
    """The endpoints of the server's state and its page."""
    return {
        "/health": {
            "get": {
                "summary": "The engine, model, limits and counters.",
                "responses": {"200": _json({"type": "object"}, "The server's state.")},
            }
        },
        "/ready": {
            "get": {
                "summary": "Whether the server takes requests now.",
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["status"],
                            "properties": {"status": {"type": "string", "enum": ["ready"]}},
                        },
                        "Ready.",
                    ),
                    "503": _json(
                        {
                            "type": "object",
                            "required": ["status", "reason"],
                            "properties": {
                                "status": {"type": "string", "enum": ["not ready"]},
                                "reason": {"type": "string"},
                            },
                        },
                        "Not ready: the queue is full, or the server loads or stops.",
                    ),
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Counters in Prometheus' text exposition format.",
                "responses": {
                    "200": {
                        "description": "The metrics.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/": {
            "get": {
                "summary": "The web page to translate in a browser.",
                "responses": {
                    "200": {
                        "description": "The page.",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }


def openapi_document(limits: Limits, backend: Any) -> dict[str, Any]:
    """The document of a server with ``limits`` over ``backend`` (its languages, decoding
    defaults and position table)."""
    languages = {
        "type": "array",
        "items": {
            "type": "object",
            "required": ["code", "name", "targets"],
            "properties": {
                "code": {"type": "string"},
                "name": {"type": "string"},
                "targets": {"type": "array", "items": {"type": "string"}},
            },
        },
    }
    positions = backend.max_positions
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "nmt-serve",
            "version": "1",
            "description": (
                f"Translation in {backend.languages.names()} with "
                f"{backend.model} (engine {backend.engine}). Limits: {limits.max_sentences} "
                f"sentences a request, {limits.max_chars} characters a sentence, "
                f"{limits.max_body_bytes} bytes a body, beam {limits.max_beam}"
                + (f", {positions - 1} subword pieces a sentence" if positions else "")
                + "."
            ),
        },
        "paths": {
            **_server_paths(),
            "/v1/translate": _native(limits, backend.defaults, backend.languages),
            "/translate": _libre(limits, backend.languages),
            "/languages": {
                "get": {
                    "summary": "The languages (LibreTranslate's API).",
                    "responses": {"200": _json(languages, "Each language, with its targets.")},
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document.",
                    "responses": {"200": _json({"type": "object"}, "The OpenAPI document.")},
                }
            },
        },
        "components": {
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {"error": {"type": "string"}},
                }
            }
        },
    }

"""Our own request body (``POST /translate`` with ``{"text": [...]}``): its checks and the
attention view of an answer."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nmt.decode.options import DecodeOptions

REQUEST_KEYS = ("text", "beam", "length_penalty", "n_best", "attention")


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

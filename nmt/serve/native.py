"""Our own request body (``POST /v1/translate`` with ``{"text": [...]}``): the hostile-proof
reading of a JSON body, the checks of our fields and the attention view of an answer."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from nmt.decode.options import DecodeOptions

REQUEST_KEYS = ("text", "source", "target", "beam", "length_penalty", "n_best", "attention")
MAX_DIGITS = 30  # an integer literal with more digits is refused before Python converts it


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Limits:
    max_sentences: int
    max_chars: int
    max_body_bytes: int
    max_beam: int
    max_segments: int = 256  # lines or html text nodes of one LibreTranslate request


def _int_literal(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise BadRequest(400, f"an integer of {len(text)} digits; at most {MAX_DIGITS}")
    return int(text)


def _float_literal(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadRequest(400, f"the number {text[:40]} is out of range")
    return value


def _constant(name: str) -> Any:
    raise BadRequest(400, f"{name} is not JSON; numbers must be finite")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for key, value in pairs:
        if key in body:
            raise BadRequest(400, f"the key {key!r} is given twice")
        body[key] = value
    return body


def decode_utf8(raw: bytes, what: str = "the body") -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(400, f"{what} is not valid UTF-8 (byte {e.start})") from None


def load_json(raw: bytes) -> Any:
    """A JSON body read as hostile: UTF-8 only, no NaN or infinite numbers, no integers of
    more than MAX_DIGITS digits, no nesting deeper than the parser's recursion limit, no key
    given twice;
    :class:`BadRequest` naming the problem."""
    text = decode_utf8(raw)
    try:
        return json.loads(
            text,
            parse_int=_int_literal,
            parse_float=_float_literal,
            parse_constant=_constant,
            object_pairs_hook=_object,
        )
    except json.JSONDecodeError as e:
        raise BadRequest(400, f"the body is not valid JSON: {e}") from None
    except RecursionError:  # the parser's own guard against deep nesting
        raise BadRequest(400, "the JSON is nested too deeply (arrays or objects)") from None


def check_text(value: str, where: str) -> str:
    """A sentence that can be encoded and tokenized: no lone surrogate (a JSON escape such
    as \\ud800 decodes to one), no NUL character."""
    for i, ch in enumerate(value):
        if "\ud800" <= ch <= "\udfff":
            raise BadRequest(
                400, f"{where} has a lone surrogate (U+{ord(ch):04X}) at character {i}"
            )
        if ch == "\0":
            raise BadRequest(400, f"{where} has a NUL character at character {i}")
    return value


def _int(body: dict, key: str, low: int, high: int, default: int) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(400, f"'{key}' must be an integer, not {type(value).__name__}")
    if not low <= value <= high:
        raise BadRequest(400, f"'{key}'={value} must be between {low} and {high}")
    return value


def parse_request(raw: bytes, limits: Limits, defaults: DecodeOptions) -> dict[str, Any]:
    """The checked fields of a /v1/translate body; :class:`BadRequest` naming the problem."""
    body = load_json(raw)
    if not isinstance(body, dict):
        raise BadRequest(400, 'the body must be a JSON object such as {"text": ["..."]}')
    unknown = sorted(set(body) - set(REQUEST_KEYS))
    if unknown:
        unknown_keys = [k.encode("utf-8", "backslashreplace").decode() for k in unknown]
        raise BadRequest(400, f"unknown key(s) {unknown_keys}; allowed: {list(REQUEST_KEYS)}")
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
        check_text(sentence, f"text[{i}]")
        if not sentence.strip():
            raise BadRequest(400, f"text[{i}] is empty or only whitespace")
    beam = _int(body, "beam", 1, limits.max_beam, defaults.beam)
    n_best = _int(body, "n_best", 1, beam, 1)
    alpha = body.get("length_penalty", defaults.length_penalty)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 10:
        raise BadRequest(400, "'length_penalty' must be a number between 0 and 10")
    attention = body.get("attention", False)
    if not isinstance(attention, bool):
        raise BadRequest(400, "'attention' must be true or false")
    languages = {}
    for key in ("source", "target"):
        value = body.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise BadRequest(400, f"'{key}' must be a language code such as \"en\"")
        languages[key] = None if value is None else check_text(value.strip(), f"'{key}'")
    return {
        "text": [s.strip() for s in sentences],
        **languages,
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

"""LibreTranslate's API (``POST /translate``, ``GET /languages``), the de facto open API of
self-hosted machine translation that browser extensions, CMS plugins and client libraries speak.

Its request fields (a JSON object, or a form: urlencoded or multipart) are ``q`` (a string or a
list of strings), ``source`` (a language code, or ``auto``), ``target``, ``format`` (``text``
or ``html``), ``alternatives`` (translations beyond the best) and ``api_key``; its answer is
``{"translatedText": ...}`` (a list for a list), with ``alternatives`` when asked for and
``detectedLanguage`` (``{"confidence", "language"}``) for ``source=auto``. Its errors are
``{"error": message}`` with LibreTranslate's messages ("Invalid request: missing q parameter",
"xx is not supported", ...). A bilingual model has one source and one target language:
``auto`` is its source language (nothing is detected: the confidence is 100). A multilingual
model (:mod:`nmt.serve.languages`) translates into each of its target languages; with ``auto``
no language is detected and none is reported.

Each line of a ``text`` request and each text node of an ``html`` one (:mod:`nmt.serve.markup`)
is a sentence of its own; empty lines are kept as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nmt.serve.languages import AUTO, Languages
from nmt.serve.markup import MarkupError, join_html, split_html, text_nodes
from nmt.serve.native import MAX_DIGITS, BadRequest, Limits, check_text

FIELDS = ("q", "source", "target", "format", "alternatives", "api_key")
FORMATS = ("text", "html")

# English names of the language codes a package may carry (ISO 639-1); another code is named
# by itself
LANGUAGE_NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "bn": "Bengali", "ca": "Catalan", "cs": "Czech",
    "da": "Danish", "de": "German", "el": "Greek", "en": "English", "eo": "Esperanto",
    "es": "Spanish", "et": "Estonian", "eu": "Basque", "fa": "Persian", "fi": "Finnish",
    "fr": "French", "ga": "Irish", "gl": "Galician", "he": "Hebrew", "hi": "Hindi",
    "hr": "Croatian", "hu": "Hungarian", "id": "Indonesian", "it": "Italian", "ja": "Japanese",
    "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian", "ms": "Malay", "nb": "Norwegian",
    "nl": "Dutch", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian",
    "sk": "Slovak", "sl": "Slovenian", "sq": "Albanian", "sr": "Serbian", "sv": "Swedish",
    "th": "Thai", "tl": "Tagalog", "tr": "Turkish", "uk": "Ukrainian", "ur": "Urdu",
    "vi": "Vietnamese", "zh": "Chinese",
}  # fmt: skip


def invalid(message: str, status: int = 400) -> BadRequest:
    return BadRequest(status, f"Invalid request: {message}")


def language_list(languages: Languages) -> list[dict[str, Any]]:
    """``GET /languages``: every language of the model, each with the codes it translates into
    (none for a language it only translates into), as LibreTranslate lists the languages it
    knows."""
    codes = sorted({lang for pair in languages.directions for lang in pair})  # sources included
    return [
        {
            "code": code,
            "name": LANGUAGE_NAMES.get(code, code),
            "targets": languages.targets_of(code) if code in languages.source_choices else [],
        }
        for code in codes
    ]


@dataclass
class LibreRequest:
    texts: list[str]  # q, as a list
    batch: bool  # q was a list: so is the answer
    source: str  # as asked ("auto" included)
    target: str
    format: str
    alternatives: int
    api_key: str | None  # for the key ring to check; read, never checked here


def _string(fields: dict[str, Any], key: str) -> str | None:
    value = fields.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(f"{key} must be a string, not {type(value).__name__}")
    return check_text(value, key)


def _alternatives(value: Any, limit: int) -> int:
    if value is None or value == "":
        return 0
    if isinstance(value, str):
        digits = value.strip()
        if not digits.lstrip("+-").isdigit() or len(digits) > MAX_DIGITS:
            raise invalid("alternatives parameter is not a number")
        value = int(digits)
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid("alternatives parameter is not a number")
    count = max(0, int(value))
    if count > limit:
        raise invalid(f"alternatives parameter must be <= {limit}")
    return count


def parse_libre(fields: Any, limits: Limits, languages: Languages) -> LibreRequest:
    """The checked fields of a LibreTranslate request (a JSON object, or the fields of a form);
    :class:`BadRequest` with LibreTranslate's message for each problem, in its order."""
    if not isinstance(fields, dict):
        raise BadRequest(400, "Invalid JSON format")
    ours = 'our own API, with {"text": [...]}, is at POST /v1/translate'
    if "text" in fields and "q" not in fields:
        raise invalid(
            f"missing q parameter; this is LibreTranslate's API (q, source, target): {ours}"
        )
    if "q" not in fields and any(str(key).lstrip().startswith("{") for key in fields):
        hint = f"; {ours}" if any('"text"' in str(key) for key in fields) else ""
        raise invalid(
            "missing q parameter; the body looks like JSON: send it with Content-Type: "
            f"application/json{hint}"
        )
    q = fields.get("q")
    if q is not None and not isinstance(q, (str, list)):
        raise invalid("q must be a string or a list of strings")
    if isinstance(q, list) and not all(isinstance(t, str) for t in q):
        raise invalid("q must be a string or a list of strings")
    if not q:
        raise invalid("missing q parameter")
    source, target = _string(fields, "source"), _string(fields, "target")
    if not source:
        raise invalid("missing source parameter")
    if not target:
        raise invalid("missing target parameter")
    alternatives = _alternatives(fields.get("alternatives"), limits.max_beam - 1)
    texts = q if isinstance(q, list) else [q]
    if isinstance(q, list) and len(q) > limits.max_sentences:
        raise invalid(f"request ({len(q)}) exceeds text limit ({limits.max_sentences})")
    for i, text in enumerate(texts):
        if len(text) > limits.max_chars:
            raise invalid(f"request ({len(text)}) exceeds text limit ({limits.max_chars})")
        check_text(text, f"q[{i}]" if isinstance(q, list) else "q")
    if source != AUTO and source not in languages.source_choices:
        raise BadRequest(400, f"{source[:100]} is not supported")
    if target not in languages.targets:
        raise BadRequest(400, f"{target[:100]} is not supported")
    try:
        languages.check(source, target)
    except BadRequest as e:  # a pair of supported languages that is not a direction
        raise BadRequest(400, f"{source[:100]}-{target[:100]} is not supported: {e}") from None
    fmt = _string(fields, "format") or "text"
    if fmt not in FORMATS:
        raise BadRequest(400, f"{fmt[:100]} format is not supported")
    return LibreRequest(
        texts, isinstance(q, list), source, target, fmt, alternatives, _string(fields, "api_key")
    )


@dataclass
class Plan:
    """The sentences a request asks to translate, and how to put the answers back."""

    sentences: list[str]  # each non-empty line of a text, or text node of a document
    where: list[str]  # the name of each in errors: q, q[2], q[2] line 3, q text node 4
    shapes: list[Any]  # per text: its lines (text), or its parts (html)


def plan(req: LibreRequest, limits: Limits) -> Plan:
    sentences, where, shapes = [], [], []
    for i, text in enumerate(req.texts):
        name = f"q[{i}]" if req.batch else "q"
        if req.format == "html":
            try:
                parts = split_html(text)
            except MarkupError as e:
                raise BadRequest(400, f"{name}: {e}") from None
            nodes = text_nodes(parts)
            sentences += nodes
            where += [f"{name} text node {k + 1}" for k in range(len(nodes))]
            shapes.append(parts)
        else:
            lines = text.split("\n")
            for k, line in enumerate(lines):
                if line.strip():
                    sentences.append(line.strip())
                    where.append(name if len(lines) == 1 else f"{name} line {k + 1}")
            shapes.append(lines)
    # counted whole (each text is within max_chars), and refused as LibreTranslate refuses a
    # request over one of its limits
    if len(sentences) > limits.max_segments:
        raise invalid(
            f"request ({len(sentences)} lines or text nodes) exceeds segment limit "
            f"(max_segments={limits.max_segments})"
        )
    return Plan(sentences, where, shapes)


def _unique(alternatives: list[str], best: str) -> list[str]:
    seen, out = {best}, []
    for text in alternatives:
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def answer(req: LibreRequest, plan_: Plan, hypotheses: list[list[str]], src: str | None) -> dict:
    """LibreTranslate's answer: ``hypotheses`` gives each sentence of ``plan_``'s its
    translations, best first (``alternatives`` + 1 of them, or fewer); ``src``: the language
    ``auto`` stands for (None: not known, and not reported)."""
    given = iter(hypotheses)
    translated, alternatives = [], []
    for shape in plan_.shapes:
        if req.format == "html":
            nodes = [next(given)[0] for _ in text_nodes(shape)]
            translated.append(join_html(shape, nodes))
            alternatives.append([])  # as LibreTranslate: none for html
            continue
        lines = [(line, next(given) if line.strip() else None) for line in shape]
        options = [
            "\n".join(line if hyps is None else hyps[min(k, len(hyps) - 1)] for line, hyps in lines)
            for k in range(req.alternatives + 1)
        ]
        translated.append(options[0])
        alternatives.append(_unique(options[1:], options[0]))
    result: dict[str, Any] = {"translatedText": translated if req.batch else translated[0]}
    if req.source == AUTO and src is not None:
        detected = {"confidence": 100.0, "language": src}
        result["detectedLanguage"] = [detected] * len(translated) if req.batch else detected
    if req.alternatives > 0:
        result["alternatives"] = alternatives if req.batch else alternatives[0]
    return result

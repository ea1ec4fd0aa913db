"""Formulas as MathML: ``$$ ... $$`` blocks and ``\\( ... \\)`` spans outside code blocks are
set aside before markdown is rendered and put back, converted, into the HTML."""

from __future__ import annotations

import re

FENCED = re.compile(r"(^```.*?^```)", re.MULTILINE | re.DOTALL)
MATH_BLOCK = re.compile(r"^\$\$\n(.+?)\n\$\$$", re.MULTILINE | re.DOTALL)
MATH_INLINE = re.compile(r"\\\((.+?)\\\)", re.DOTALL)
MATH_TOKEN = re.compile(r"(<p>)?NMTMATH(\d+)X(</p>)?")


def stash_math(markdown: str) -> tuple[str, list[str]]:
    """Formulas replaced by tokens (outside code blocks) and their MathML, in token order."""
    from latex2mathml.converter import convert

    maths: list[str] = []

    def keep(html: str, block: bool) -> str:
        maths.append(html)
        token = f"NMTMATH{len(maths) - 1}X"
        return f"\n{token}\n" if block else token

    parts = FENCED.split(markdown)
    for i in range(0, len(parts), 2):
        part = MATH_BLOCK.sub(lambda m: keep(convert(m.group(1), display="block"), True), parts[i])
        inline = MATH_INLINE.sub(lambda m: keep(convert(" ".join(m.group(1).split())), False), part)
        parts[i] = inline
    return "".join(parts), maths


def unstash_math(html: str, maths: list[str]) -> str:
    def put(match: re.Match) -> str:
        math = maths[int(match.group(2))]
        if match.group(1) and match.group(3):
            return f'<div class="math">{math}</div>'
        return (match.group(1) or "") + math + (match.group(3) or "")

    return MATH_TOKEN.sub(put, html)

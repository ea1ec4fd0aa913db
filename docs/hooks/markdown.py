"""Text for markdown pages: table cells escaped, docstring markup and YAML comments as markdown."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path


def rst_to_md(text: str) -> str:
    """Docstring markup as markdown: ``x`` and :role:`x` become `x`; ``<`` outside code escaped."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return md_text(text.replace("``", "`"))


def md_text(text: str) -> str:
    """Plain text for a table cell: ``<`` and ``>`` outside code spans escaped, ``|`` too."""
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
    return "".join(parts)


def yaml_head(path: Path) -> list[str]:
    """The leading comment lines of a YAML file (``# @package`` left out)."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            lines.append(line[1:])
    return lines


def comment_md(lines: list[str]) -> str:
    """Comment lines as markdown: indented lines (commands) as a code block, the rest as text."""
    out, code = [], []
    for line in [*lines, ""]:
        if line.startswith("   "):
            code.append(line[1:])
            continue
        if code:
            out.append("\n```\n" + textwrap.dedent("\n".join(code)) + "\n```\n")
            code = []
        out.append(md_text(line.strip()))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()

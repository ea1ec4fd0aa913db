"""The Environment variables page: every variable nmt reads or sets, from nmt.environment."""

from __future__ import annotations

from docs.hooks.markdown import md_text
from nmt.environment import VARIABLES


def environment() -> str:
    """A table of :data:`nmt.environment.VARIABLES`, names that share a meaning on one row."""
    rows = ["| variable | what nmt does with it |", "|---|---|"]
    for names, what in VARIABLES.items():
        listed = ", ".join(f"`{n.strip()}`" for n in names.split(","))
        rows.append(f"| {listed} | {md_text(what)} |")
    return "\n".join(rows) + "\n"

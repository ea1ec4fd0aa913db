"""The generated sections of the pages: ``<!-- nmt:NAME -->`` on a line of its own in a page is
replaced by the section NAME of :data:`SECTIONS`, written from the checkout at ``repo``."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from docs.hooks.commands import commands, make_targets
from docs.hooks.configuration import config_groups, config_train
from docs.hooks.environment import environment
from docs.hooks.listings import code
from docs.hooks.pooling import pooling_table
from docs.hooks.run_files import metrics_events, package_files, summary_fields

MARKER = re.compile(r"^<!-- nmt:([a-z-]+) -->$", re.MULTILINE)

# name -> the section written from the checkout (some need only the code of nmt)
SECTIONS: dict[str, Callable[[Path], str]] = {
    "config-groups": config_groups,
    "config-train": lambda repo: config_train(),
    "commands": commands,
    "make-targets": make_targets,
    "metrics-events": lambda repo: metrics_events(),
    "summary-fields": lambda repo: summary_fields(),
    "package-files": lambda repo: package_files(),
    "environment": lambda repo: environment(),
    "code": code,
    "pooling": pooling_table,
}


def expand(markdown: str, repo: Path) -> str:
    """A page with each ``<!-- nmt:NAME -->`` line replaced by its section."""

    def section(match: re.Match) -> str:
        name = match.group(1)
        if name not in SECTIONS:
            raise LookupError(f"<!-- nmt:{name} -->: no such section ({', '.join(SECTIONS)})")
        return SECTIONS[name](repo)

    return MARKER.sub(section, markdown)

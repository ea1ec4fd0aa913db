"""The generated parts of the documentation site (docs.hooks), read from the code so that they
cannot drift.

mkdocs loads this file as a hook (``hooks:`` in mkdocs.yml): the hooks of
:mod:`docs.hooks.hooks` write each ``<!-- nmt:NAME -->`` section into its page, add the figures
and turn formulas into MathML.

``python scripts/docs_reference.py [NAME ...]`` prints sections (all of them by default).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# benchmarks/ and docs/hooks/ live beside the package, at the checkout's root
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from docs.hooks.hooks import on_files, on_page_content, on_page_markdown
from docs.hooks.sections import SECTIONS

__all__ = ["on_files", "on_page_content", "on_page_markdown"]

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Print generated sections of the docs site.")
    parser.add_argument("names", nargs="*", help=f"default: all ({', '.join(SECTIONS)})")
    names = parser.parse_args(argv).names or list(SECTIONS)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        parser.error(f"no section {', '.join(unknown)}")
    for name in names:
        print(SECTIONS[name](REPO))


if __name__ == "__main__":
    main()

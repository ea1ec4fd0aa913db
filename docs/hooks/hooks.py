"""The mkdocs hooks of the site (``hooks:`` in mkdocs.yml names scripts/docs_reference.py, which
hands them these): the figures added as generated files, the generated sections written into
the pages and the formulas turned into MathML. The checkout is the folder of mkdocs.yml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from docs.hooks.figures import figures
from docs.hooks.mathml import stash_math, unstash_math
from docs.hooks.sections import expand

# a page's formulas, from its markdown (stashed) to its HTML (put back)
_PAGE_MATH: dict[str, list[str]] = {}


def checkout(config: Any) -> Path:
    """The repository the site is built from: the folder of its mkdocs.yml."""
    return Path(config.config_file_path).resolve().parent


def on_files(files: Any, config: Any) -> Any:
    """Add the figures to the site as generated files."""
    from mkdocs.structure.files import File

    for path, content in figures(checkout(config)).items():
        existing = files.get_file_from_path(path)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, path, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Write the generated sections into the page and set its formulas aside."""
    markdown, _PAGE_MATH[page.file.src_uri] = stash_math(expand(markdown, checkout(config)))
    return markdown


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Put the page's formulas back, as MathML."""
    return unstash_math(html, _PAGE_MATH.pop(page.file.src_uri, []))

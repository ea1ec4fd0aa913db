"""The attention heatmap's script and style (``heatmap.js``, ``heatmap.css`` beside this
module), shared by the attention explorer and the server's page: each page's template marks
where they go, and :func:`inline_heatmap` puts them there, so that every page stays one
self-contained file. Imports no PyTorch (the server on CTranslate2 uses it)."""

from __future__ import annotations

from importlib import resources

JS_MARKER = "/*NMT-HEATMAP-JS*/"
CSS_MARKER = "/*NMT-HEATMAP-CSS*/"


def heatmap_assets() -> tuple[str, str]:
    """The heatmap's script and style."""
    folder = resources.files("nmt.viz")
    return (
        folder.joinpath("heatmap.js").read_text(encoding="utf-8"),
        folder.joinpath("heatmap.css").read_text(encoding="utf-8"),
    )


def inline_heatmap(template: str, name: str) -> str:
    """``template`` (a page called ``name`` in errors) with the heatmap's script and style in
    place of its one JS and one CSS marker."""
    js, css = heatmap_assets()
    for marker in (JS_MARKER, CSS_MARKER):
        if template.count(marker) != 1:
            raise RuntimeError(f"{name}: expected one marker {marker}")
    return template.replace(JS_MARKER, js).replace(CSS_MARKER, css)

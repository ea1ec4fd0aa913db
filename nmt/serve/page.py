"""The page at ``GET /``: a person tries the model in a browser (text, target language, the
translation, its alternatives and its attention drawn by the explorer's heatmap).

The page is one file (``page.html`` with nmt/viz's heatmap inlined) that loads nothing
else; the server sends it with a Content-Security-Policy that allows only its own inline
script and style (by their SHA-256) and requests to its own server.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from importlib import resources
from typing import Any

from nmt.viz.heatmap import inline_heatmap

TEMPLATE = "page.html"
DATA_MARKER = "/*NMT-PAGE-DATA*/"
INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.S)  # the executable script, the style


def script_json(data: dict[str, Any]) -> str:
    """JSON that is safe inside a <script> element: no '<', '>' or '&' appears raw."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _sha256(text: str) -> str:
    digest = base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")
    return f"'sha256-{digest}'"


def render_page(info: dict[str, Any]) -> tuple[str, str]:
    """The page with ``info`` (what it says about the server) inlined, and its
    Content-Security-Policy."""
    template = resources.files("nmt.serve").joinpath(TEMPLATE).read_text(encoding="utf-8")
    if template.count(DATA_MARKER) != 1:
        raise RuntimeError(f"{TEMPLATE}: expected one data marker {DATA_MARKER}")
    html = inline_heatmap(template, TEMPLATE).replace(DATA_MARKER, script_json(info))
    found = {"script": [], "style": []}
    for kind, body in INLINE.findall(html):
        found[kind].append(_sha256(body))
    if len(found["script"]) != 1 or len(found["style"]) != 1:
        raise RuntimeError(f"{TEMPLATE}: expected one <script> and one <style>")
    policy = "; ".join(
        [
            "default-src 'none'",
            f"script-src {found['script'][0]}",
            f"style-src {found['style'][0]}",
            "img-src data:",
            "connect-src 'self'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )
    return html, policy


def page_headers(policy: str) -> dict[str, str]:
    return {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }

"""The Source of the concepts page: the functions and classes the concept pages explain, listed
from the code with their lines and linked back to the pages that explain them."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

# The code the concept pages explain: (file, qualified name); each gets the anchor
# <file stem>-<name with '.' as '-'> on reference/code.md.
CODE = [
    ("nmt/models/attention.py", "masked_softmax"),
    ("nmt/models/attention.py", "dot_scores"),
    ("nmt/models/attention.py", "scaled_dot_scores"),
    ("nmt/models/attention.py", "ScoredAttention.forward"),
    ("nmt/models/attention.py", "AdditiveScore"),
    ("nmt/models/attention.py", "DotScore"),
    ("nmt/models/attention.py", "ScaledDotScore"),
    ("nmt/models/attention.py", "GeneralScore"),
    ("nmt/models/attention.py", "make_score"),
    ("nmt/models/attention.py", "attention_mask"),
    ("nmt/models/attention.py", "MultiHeadAttention"),
    ("nmt/models/gru.py", "GRUBahdanau._encode"),
    ("nmt/models/gru.py", "GRUBahdanau._bridge"),
    ("nmt/models/gru.py", "GRUBahdanau._step"),
    ("nmt/models/gru.py", "GRUBahdanau._features"),
    ("nmt/models/transformer.py", "sinusoidal_positions"),
    ("nmt/models/transformer.py", "PositionalEmbedding"),
    ("nmt/models/transformer.py", "Transformer._embed"),
    ("nmt/models/transformer.py", "_Layer.feed_forward"),
    ("nmt/models/transformer.py", "_Layer.residual"),
    ("nmt/models/transformer.py", "EncoderLayer.forward"),
    ("nmt/models/transformer.py", "DecoderLayer.forward"),
    ("nmt/train/optim.py", "_warmup"),
    ("nmt/train/optim.py", "inverse_sqrt"),
    ("nmt/train/optim.py", "noam"),
    ("nmt/train/optim.py", "cosine"),
    ("nmt/train/optim.py", "linear"),
    ("nmt/train/optim.py", "constant"),
    ("nmt/train/optim.py", "schedule_fn"),
    ("nmt/models/loss.py", "reference_cross_entropy"),
    ("nmt/decode/search.py", "length_penalty"),
    ("nmt/decode/search.py", "_cannot_improve"),
    ("nmt/decode/search.py", "beam_search"),
    ("scripts/attention_pooling.py", "average_pooling"),
    ("scripts/attention_pooling.py", "attention_pooling"),
    ("scripts/attention_pooling.py", "fit_w"),
]


def code_anchor(path: str, qualname: str) -> str:
    """The anchor of a listing on reference/code.md."""
    return f"{Path(path).stem}-{qualname.replace('.', '-')}"


def code_listing(repo: Path, path: str, qualname: str) -> tuple[int, int, str]:
    """(first line, last line, source) of a function or class, decorators included."""
    text = (repo / path).read_text(encoding="utf-8")
    body: list[ast.stmt] = ast.parse(text).body
    node: ast.AST | None = None
    for name in qualname.split("."):
        defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        node = next((n for n in body if isinstance(n, defs) and n.name == name), None)
        if node is None:
            raise LookupError(f"{path}: no {qualname} (listed in docs/hooks/listings.py CODE)")
        body = node.body
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    lines = text.splitlines()[first - 1 : node.end_lineno]
    return first, node.end_lineno, textwrap.dedent("\n".join(lines))


def concept_links(repo: Path) -> dict[str, list[tuple[str, str]]]:
    """Anchor of reference/code.md -> (title, file) of each concept page that links to it."""
    found: dict[str, list[tuple[str, str]]] = {}
    for page in sorted((repo / "docs/concepts").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        title = text.splitlines()[0].lstrip("# ").strip()
        for anchor in dict.fromkeys(re.findall(r"code\.md#([\w-]+)", text)):
            found.setdefault(anchor, []).append((title, page.name))
    return found


def code(repo: Path) -> str:
    """Each function or class of :data:`CODE`, by file, with the pages that explain it."""
    out, current = [], None
    explained = concept_links(repo)
    for path, qualname in CODE:
        if path != current:
            current = path
            out.append(f"## `{path}`\n")
        first, last, source = code_listing(repo, path, qualname)
        anchor = code_anchor(path, qualname)
        pages = ", ".join(f"[{t}](../concepts/{f})" for t, f in explained.get(anchor, []))
        where = f"; explained in {pages}" if pages else ""
        out.append(f"### `{qualname}` {{#{anchor}}}\n\n`{path}`, lines {first}-{last}{where}:\n")
        out.append(f"```python\n{source}\n```\n")
    return "\n".join(out)

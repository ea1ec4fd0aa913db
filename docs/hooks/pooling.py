"""The attention pooling demo (scripts/attention_pooling.py) run once for the site: its table of
test errors and its figures."""

from __future__ import annotations

import functools
import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import Any


@functools.cache
def pooling(repo: Path) -> dict[str, Any]:
    """scripts/attention_pooling.py run once: its test MSEs, learned w and figures (PNG bytes)."""
    spec = importlib.util.spec_from_file_location(
        "attention_pooling", repo / "scripts/attention_pooling.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory() as out:
        result = module.run(Path(out))
        result["png"] = {p.name: p.read_bytes() for p in result.pop("files")}
    return result


def pooling_table(repo: Path) -> str:
    """The test error of each estimate and the learned w."""
    result = pooling(repo)
    rows = ["| estimate | test MSE |", "|---|---|"]
    rows += [f"| {name} | {mse:.3f} |" for name, mse in result["mse"].items()]
    return "\n".join(rows) + f"\n\nLearned w: {result['w']:.2f}.\n"

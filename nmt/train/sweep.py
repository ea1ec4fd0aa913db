"""A Hydra callback that sums up a multirun sweep: one line per run, best validation BLEU first."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from nmt.atomic import atomic_write_bytes

log = logging.getLogger(__name__)


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    """The ``summary.json`` of every run under ``sweep_dir``, sorted by best BLEU."""
    rows = []
    for path in sorted(sweep_dir.glob("*/summary.json")):
        row = json.loads(path.read_text())
        row["dir"] = str(path.parent)
        rows.append(row)
    return sorted(rows, key=lambda r: r.get("best_bleu", -1.0), reverse=True)


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'best BLEU':>9}  {'step':>6}  {'updates':>7}  overrides"]
    for r in rows:
        lines.append(
            f"{r['best_bleu']:9.2f}  {r['best_step']:6d}  {r['step']:7d}  "
            f"{' '.join(r.get('overrides', [])) or '(defaults)'}"
        )
    return "\n".join(lines)


class SweepSummary(Callback):
    """Writes ``<sweep dir>/summary.json`` and prints the table when a multirun ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = collect(sweep_dir)
        if not rows:
            return
        atomic_write_bytes(sweep_dir / "summary.json", json.dumps(rows, indent=2).encode())
        print(f"\nSweep summary ({sweep_dir / 'summary.json'}):\n{format_table(rows)}")

"""Markdown rows of the results table from finished, evaluated runs (benchmarks.results_table).

python scripts/results_table.py outputs/runs/*cpu_quick* outputs/runs/*gru*
python scripts/results_table.py --json results.json outputs/runs/*
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# benchmarks/ and docs/hooks/ live beside the package, at the checkout's root
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from benchmarks import results_table as table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=f"{__doc__}\n{table.__doc__}", formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run directories")
    parser.add_argument("--json", type=Path, help="also write the rows and runs as JSON")
    parser.add_argument(
        "--checkpoint",
        help="score this checkpoint choice (best, averaged, last, auto) instead of each run's own",
    )
    args = parser.parse_args(argv)
    rows, skipped = table.collect(args.runs, args.checkpoint)
    for run, why in skipped.items():
        print(f"skipped {run}: {why}", file=sys.stderr)
    print(table.markdown(rows))
    if args.json:
        payload = table.rows_json(rows)
        args.json.write_text(json.dumps(payload, indent=2, ensure_ascii=False))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())

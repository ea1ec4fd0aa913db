"""Memory over a long training run: ``make bench-soak`` (benchmarks.soak).

python scripts/bench_soak.py                         # or: make bench-soak
python scripts/bench_soak.py --minutes 10 --early 2  # a shorter soak
python scripts/bench_soak.py --set trainer.precision=32 --set model=gru_bahdanau
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# benchmarks/ and docs/hooks/ live beside the package, at the checkout's root
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from benchmarks import soak
from benchmarks.report import json_out, write_result

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=f"{__doc__}\n{soak.__doc__}", formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="training time")
    parser.add_argument("--early", type=float, default=5.0, help="minute of the first window")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument(
        "--set",
        action="append",
        default=["experiment=cpu_quick", "trainer.log_every=10"],
        help="a config override (repeatable), after experiment=cpu_quick trainer.log_every=10",
    )
    parser.add_argument("--run-dir", type=Path, help="the run's directory (default: a temp)")
    parser.add_argument("--out", help="the JSON file (default: outputs/bench/...)")
    args = parser.parse_args(argv)
    s = soak.SoakSettings(args.minutes, args.early, args.interval, args.set, args.run_dir, REPO)
    result = soak.run(s)
    write_result(json_out(args.out, "bench-soak", REPO), result, soak.report(result, args.early))
    return 0


if __name__ == "__main__":
    sys.exit(main())

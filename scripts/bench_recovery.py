"""Recovery from a rank's death under torchrun: ``make bench-recovery`` (benchmarks.recovery).

python scripts/bench_recovery.py                                   # or: make bench-recovery
python scripts/bench_recovery.py --kill-at 150 --set trainer.save_every_minutes=1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

# benchmarks/ and docs/hooks/ live beside the package, at the checkout's root
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from benchmarks import recovery
from benchmarks.report import SetupError, json_out, write_result

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=f"{__doc__}\n{recovery.__doc__}",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    parser.add_argument("--kill-at", type=int, default=100, help="update before the kill")
    parser.add_argument(
        "--max-steps", type=int, default=0, help="updates of the run (default: kill-at + 100)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        help="a config override (repeatable), after experiment=cpu_quick",
    )
    parser.add_argument(
        "--to-end",
        action="store_true",
        help="let the run finish (default: stop it once the "
        "restarted group logged its first window)",
    )
    parser.add_argument("--run-dir", type=Path, help="the run's directory (default: a temp)")
    parser.add_argument("--out", help="the JSON file (default: outputs/bench/...)")
    args = parser.parse_args(argv)
    if args.kill_at < 1:
        parser.error(f"--kill-at {args.kill_at}: must be >= 1")
    with tempfile.TemporaryDirectory(prefix="nmt-recovery-") as tmp:
        settings = recovery.RecoverySettings(
            run_dir=args.run_dir or Path(tmp) / "run",
            kill_at=args.kill_at,
            overrides=["experiment=cpu_quick", *args.set],
            max_steps=args.max_steps,
            cwd=REPO,
            to_end=args.to_end,
        )
        try:
            result = recovery.run(settings)
        except SetupError as e:
            print(f"bench-recovery: {e}", file=sys.stderr)
            return 2
    result["command"] = "python scripts/bench_recovery.py " + " ".join(argv or sys.argv[1:])
    write_result(json_out(args.out, "bench-recovery", REPO), result, recovery.report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

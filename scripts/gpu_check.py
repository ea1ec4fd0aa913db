"""GPU check: every training path of nmt in one run, and a table of what passed
(benchmarks.gpu_check). On the GPU machine run it through ``bash scripts/gpu_check.sh``.
Elsewhere::

    python scripts/gpu_check.py --device cpu --quick --parts precision,resume --override ...

Helper commands (standard library only, used by gpu_check.sh and ``make gpu-wheels``)::

    python scripts/gpu_check.py missing-wheels DIR        # wheels to install, one per line
    python scripts/gpu_check.py unpack-wheels SITE WHEEL...  # install without pip
    python scripts/gpu_check.py fetch-wheels --dest DIR   # download them (needs network)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # nmt and benchmarks/ from this checkout, however started
    sys.path.insert(1, str(REPO))

# each of these imports only the standard library at load time
from benchmarks import gpu_check, gpu_check_report, gpu_wheels
from benchmarks.gpu_check import CheckFailed
from benchmarks.report import write_json


def missing_wheels(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpu_check.py missing-wheels")
    p.add_argument("wheel_dir", type=Path)
    args = p.parse_args(argv)
    for path in gpu_wheels.wheels_to_install(args.wheel_dir):
        print(path)
    return 0


def unpack_wheels(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpu_check.py unpack-wheels")
    p.add_argument("site", type=Path)
    p.add_argument("wheels", nargs="+", type=Path)
    args = p.parse_args(argv)
    args.site.mkdir(parents=True, exist_ok=True)
    for wheel in args.wheels:
        gpu_wheels.unpack_wheel(wheel, args.site)
    return 0


def fetch_wheels(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpu_check.py fetch-wheels")
    p.add_argument("--dest", type=Path, default=REPO / gpu_wheels.WHEELS_DIR)
    p.add_argument("--python-version", default="3.12", help="of the GPU machine (default 3.12)")
    args = p.parse_args(argv)
    wheels = gpu_wheels.fetch_wheels(args.dest, args.python_version)
    size = sum(w.stat().st_size for w in wheels)
    print(f"{len(wheels)} wheels, {size / 2**20:.1f} MiB in {args.dest}")
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    from benchmarks.gpu_check_parts import PARTS

    listing = "\n".join(
        f"  {p.name:<18} {p.what}{'' if p.default else ' (only when named)'}" for p in PARTS
    )
    groups = sorted({g for p in PARTS for g in p.groups})
    p = argparse.ArgumentParser(
        description=f"{__doc__}\n{gpu_check.__doc__}\nthe parts:\n{listing}",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (default cuda)")
    p.add_argument(
        "--parts",
        default="",
        help=f"comma-separated parts or groups ({', '.join(groups)}, all); default: every part "
        "but quality",
    )
    p.add_argument("--quick", action="store_true", help="tiny models, a few updates per run")
    p.add_argument(
        "--budget",
        type=float,
        default=gpu_check.BUDGET_SECONDS,
        help=f"seconds for the whole check (default {gpu_check.BUDGET_SECONDS:.0f})",
    )
    p.add_argument(
        "--run-seconds", type=float, default=20, help="training time of each short run (20)"
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra override for every training run (repeatable)",
    )
    p.add_argument("--work", type=Path, help="the runs' folder (default: beside --out)")
    p.add_argument(
        "--out", type=Path, default=REPO / gpu_check.OUT, help=f"JSON (default {gpu_check.OUT})"
    )
    q = p.add_argument_group("the quality part (--parts quality)")
    q.add_argument("--train-seconds", type=float, default=180, help="training time (180)")
    q.add_argument("--experiment", default="gpu_quick", help="training preset (gpu_quick)")
    q.add_argument("--matmul-n", type=int, default=0, help="matmul size (default 8192; CPU 512)")
    q.add_argument("--bench-steps", type=int, default=20, help="timed bench steps (0 = no bench)")
    q.add_argument("--bench-warmup", type=int, default=5, help="untimed bench steps first")
    q.add_argument("--no-eval", action="store_true", help="skip the test-set evaluation")
    q.add_argument("--goal-bleu", type=float, default=40.0, help="target test BLEU (default 40)")
    return p.parse_args(argv)


def check(argv: list[str]) -> int:
    """The check; exit status 0 when no part failed, 1 otherwise."""
    args = parse_args(argv)
    work = args.work.resolve() if args.work else None
    s = gpu_check.GpuCheckSettings(
        repo=REPO, **{**vars(args), "out": args.out.resolve(), "work": work}
    )
    result = gpu_check.run_check(s, announce=lambda line: print(line, flush=True))
    write_json(s.out, result)
    print()
    print(gpu_check_report.report(result))
    print(f"\nwritten: {s.out}")
    return 0 if result["passed"] else 1


SUBCOMMANDS = {
    "missing-wheels": missing_wheels,
    "unpack-wheels": unpack_wheels,
    "fetch-wheels": fetch_wheels,
}
WHEEL_PROBLEM = 3  # gpu_check.sh stops with this status when the wheels cannot be installed


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = SUBCOMMANDS.get(argv[0]) if argv else None
    try:
        return command(argv[1:]) if command else check(argv)
    except CheckFailed as e:
        msg = str(e)
        print(msg if msg.startswith("error:") else f"error: {msg}", file=sys.stderr)
        return WHEEL_PROBLEM if command is missing_wheels else 1


if __name__ == "__main__":
    sys.exit(main())

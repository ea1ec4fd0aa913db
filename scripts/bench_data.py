"""Scale benchmark of the data path: ``make bench-data`` (benchmarks.data_scale).

python scripts/bench_data.py                          # or: make bench-data
python scripts/bench_data.py --pairs 29000,290000     # some sizes only
python scripts/bench_data.py --quick                  # 29,000 and 58,000 pairs: a smoke run
python scripts/bench_data.py --set model=gru_bahdanau # any config override
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# benchmarks/ and docs/hooks/ live beside the package, at the checkout's root
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from benchmarks import data_scale
from benchmarks.report import write_json

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=f"{__doc__}\n{data_scale.__doc__}",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    parser.add_argument(
        "--pairs",
        default="29000,290000,2900000",
        help="corpus sizes, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 29,000 and 58,000 pairs, 2 DDP updates"
    )
    parser.add_argument("--workers", type=int, default=0, help="data.num_workers (0: the cores)")
    parser.add_argument(
        "--ddp-steps",
        type=int,
        default=6,
        help="DDP updates before the ranks' memory is read (0: no DDP run)",
    )
    parser.add_argument(
        "--work",
        default=str(REPO / "outputs" / "bench" / "data"),
        help="corpora, caches and runs (default: %(default)s)",
    )
    parser.add_argument(
        "--precision",
        default="32",
        help="trainer.precision of the training runs (default: %(default)s; auto measures "
        "both precisions on a CPU with native bf16 the first time, a cost that is not the data's)",
    )
    parser.add_argument("--data-root", default="data", help="where Multi30k is (or is fetched)")
    parser.add_argument("--keep-caches", action="store_true", help="keep the prepared caches")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        help="a config override for every run (repeatable), e.g. model=gru_bahdanau",
    )
    parser.add_argument("--out", default=None, help="the JSON file (default: outputs/bench/...)")
    args = parser.parse_args(argv)
    if args.quick:
        args.pairs, args.ddp_steps = "29000,58000", min(args.ddp_steps, 2)
    args.sizes = [int(x) for x in str(args.pairs).split(",") if x.strip()]
    if not args.sizes or min(args.sizes) <= 0:
        parser.error(f"--pairs={args.pairs!r}: give positive sizes, e.g. 29000,290000")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = [sys.argv[0], *(argv if argv is not None else sys.argv[1:])]
    s = data_scale.DataScaleSettings(
        sizes=args.sizes,
        work=Path(args.work),
        data_root=Path(args.data_root),
        cwd=REPO,
        command=command,
        quick=args.quick,
        workers=args.workers,
        ddp_steps=args.ddp_steps,
        precision=args.precision,
        keep_caches=args.keep_caches,
        overrides=args.overrides,
    )
    result = data_scale.run(s)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else REPO / "outputs" / "bench" / f"bench-data-{stamp}.json"
    write_json(out, result)
    print(data_scale.report(result))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

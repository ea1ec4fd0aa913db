"""Shipping benchmarks: ``make bench-serve`` (benchmarks.serve).

    python scripts/bench_serve.py --transformer RUN/checkpoints/best.pt \\
        --transformer-base BASE/checkpoints/last.pt --gru GRU/checkpoints/best.pt
    python scripts/bench_serve.py --quick ...     # a smoke run: few sentences and requests
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

# benchmarks/ and docs/hooks/ live beside the package, at the checkout's root
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from benchmarks import serve
from benchmarks.report import write_json

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=f"{__doc__}\n{serve.__doc__}", formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--transformer", help="checkpoint (or run) of the default Transformer")
    p.add_argument("--transformer-base", help="checkpoint (or run) of model=transformer_base")
    p.add_argument("--gru", help="checkpoint (or run) of the GRU model")
    p.add_argument("--test", help="SRC:REF files instead of each model's own test split")
    p.add_argument("--sentences", type=int, default=0, help="test sentences (0 = all)")
    p.add_argument("--base-sentences", type=int, default=200, help="for --transformer-base")
    p.add_argument("--fixed-length", type=int, default=20, help="output length, --transformer-base")
    p.add_argument(
        "--fixed-length-all",
        type=int,
        default=0,
        help="force this output length for --transformer and --gru too (barely trained weights)",
    )
    p.add_argument(
        "--fixed-length-gru",
        type=int,
        default=0,
        help="force this output length for --gru only (default: --fixed-length-all)",
    )
    p.add_argument("--threads", type=int, default=2, help="threads of every engine")
    p.add_argument("--rounds", type=int, default=2, help="timed runs per measurement (best kept)")
    p.add_argument("--serve", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--levels", default="1,8,32", help="concurrent clients of the load test")
    p.add_argument(
        "--per-request",
        type=int,
        default=8,
        help="sentences per request of one more level, at the most clients (0: no such level)",
    )
    p.add_argument("--requests", type=int, default=400, help="requests per load level")
    p.add_argument("--level-seconds", type=float, default=30.0, help="time bound of a level")
    p.add_argument("--malformed", type=int, default=1000, help="malformed requests sent")
    p.add_argument(
        "--offline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="offline figures and the server's load levels (--no-offline: only --overload)",
    )
    p.add_argument("--overload", action="store_true", help="the overload phases, --transformer")
    p.add_argument("--overload-seconds", type=float, default=20.0, help="of the overload phase")
    p.add_argument(
        "--patience", type=float, default=10.0, help="client timeout and request_timeout (s)"
    )
    p.add_argument("--burst-clients", type=int, default=100, help="of the abandoned burst")
    p.add_argument("--burst-patience", type=float, default=2.0, help="s before they give up")
    p.add_argument("--recovery-cap", type=float, default=120.0, help="s of probing, at most")
    p.add_argument("--ab-base", help="a checkout of the code before, for A/B figures")
    p.add_argument(
        "--overload-engines",
        default="torch,ctranslate2",
        choices=["torch,ctranslate2", "torch", "ctranslate2"],
        help="the engines of the overload phases",
    )
    p.add_argument("--ab-rounds", type=int, default=3, help="A B rounds (medians)")
    p.add_argument(
        "--setting-ab",
        metavar="KEY=VALUE",
        help="overload this code with a server setting (A) and without it (B), alternating",
    )
    p.add_argument("--setting-rounds", type=int, default=3, help="its A B rounds (medians)")
    p.add_argument(
        "--setting-levels",
        action="store_true",
        help="the setting A/B also runs the load levels (--levels), on a fresh server each round",
    )
    p.add_argument("--work", default="outputs/bench/serve-work", help="packages and caches")
    p.add_argument("--out", help="JSON (default outputs/bench/bench-serve-<timestamp>.json)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 40 sentences, few requests")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = " ".join(["python", "scripts/bench_serve.py", *(argv or sys.argv[1:])])
    s = serve.ServeSettings(**vars(args), command=command, cwd=REPO)
    result = serve.run(s)
    out = Path(s.out or f"outputs/bench/bench-serve-{datetime.now():%Y-%m-%d-%H%M%S}.json")
    write_json(out, result)
    serve.say(f"wrote {out}")
    print(json.dumps(serve.summary(result), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

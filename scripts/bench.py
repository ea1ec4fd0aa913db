"""Training and decoding speed of the default models: ``make bench`` (benchmarks.speed).

python scripts/bench.py                      # or: make bench
python scripts/bench.py --quick              # about a minute: a smoke run, noisy figures
python scripts/bench.py --models transformer --precision bf16 --device cuda
python scripts/bench.py --models transformer --compile both      # eager and torch.compile
python scripts/bench.py --set model.attn_dropout=0               # any config override
python scripts/bench.py --profile            # where the time goes: phases, modules, operators
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

# benchmarks/ and docs/hooks/ live beside the package, at the checkout's root
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from benchmarks import profiling, speed
from benchmarks.report import SetupError, json_out, write_result

REPO = Path(__file__).resolve().parents[1]
PROFILE_SENTENCES = 200  # the profile decodes the first test sentences, not the whole set


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=f"{__doc__}\n{speed.__doc__}", formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument("--models", default=",".join(speed.MODELS), help="comma-separated configs")
    p.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "32", "bf16", "both"],
        help="training precision(s); auto = both where the device has native bf16, else 32",
    )
    p.add_argument("--steps", type=int, help="timed training steps (default 10, quick 3)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default 3, quick 1)")
    p.add_argument("--sentences", type=int, help="test sentences decoded (default all; quick 100)")
    p.add_argument(
        "--single-sentences",
        type=int,
        help=f"decoded one at a time (default {speed.SINGLE_SENTENCES}; quick 30; 0 = all)",
    )
    p.add_argument(
        "--decode-precision",
        default="auto",
        choices=["auto", "32", "bf16"],
        help="autocast for decoding; auto = bf16 on CUDA, else 32",
    )
    p.add_argument("--max-tokens", type=int, help="training batch budget (default data.max_tokens)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--ckpt-transformer", help="checkpoint for decoding the Transformer")
    p.add_argument("--ckpt-gru", help="checkpoint for decoding the GRU model")
    p.add_argument("--runs", default="outputs/runs", help="where to look for trained runs")
    p.add_argument("--data-root", default=str(REPO / "data"), help="data.root for Multi30k")
    p.add_argument("--out", help="JSON output (default outputs/bench/bench-<timestamp>.json)")
    p.add_argument(
        "--compile",
        default="off",
        choices=["off", "on", "both"],
        help="time training with torch.compile (trainer.compile=true) too; default off",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a training config override for every model, e.g. model.attn_dropout=0 (repeatable)",
    )
    p.add_argument(
        "--decode",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure decoding too (--no-decode: training only)",
    )
    p.add_argument("--quick", action="store_true", help="few steps and sentences (~1 minute)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="profile instead of timing: where a training step and a batched decode spend "
        "their time, by phase, module and operator (benchmarks.profiling; JSON "
        f"outputs/bench/profile-<time>.json; decodes {PROFILE_SENTENCES} sentences unless "
        "--sentences)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = vars(parse_args(argv))
    threads = args.pop("threads")
    if threads > 0:
        torch.set_num_threads(threads)
    profile_run = args.pop("profile")
    if profile_run:
        args["out"] = str(json_out(args["out"], "profile", REPO))
        if args["sentences"] is None:
            args["sentences"] = PROFILE_SENTENCES // (4 if args["quick"] else 1)
    try:
        s = speed.make_settings(**args)
    except SetupError as err:
        print(err, file=sys.stderr)
        return 2
    bench = profiling if profile_run else speed
    result = bench.run(s)
    write_result(s.out, result, bench.report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

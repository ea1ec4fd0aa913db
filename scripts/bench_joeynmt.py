"""Speed of nmt next to JoeyNMT 2.3.0 on the same CPU: ``make bench-joeynmt``
(benchmarks.joeynmt).

    python scripts/bench_joeynmt.py --joey-python ../joeyvenv/bin/python --joey-dir ../joeywork
    python scripts/bench_joeynmt.py ... --quick      # a smoke run: a few steps, 50 sentences
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# benchmarks/ and docs/hooks/ live beside the package, at the checkout's root
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from benchmarks import joeynmt, joeynmt_report, joeynmt_setup
from benchmarks.report import SetupError, write_result

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=f"{__doc__}\n{joeynmt.__doc__}", formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--joey-python", required=True, help="python of JoeyNMT's virtual env")
    p.add_argument("--joey-dir", required=True, help="JoeyNMT's working folder (data/, spm/)")
    p.add_argument(
        "--joey-configs",
        default=str(REPO / "scripts" / "joeynmt"),
        help="folder with JoeyNMT's transformer.yaml and rnn.yaml (default scripts/joeynmt)",
    )
    p.add_argument("--joey-ckpt-transformer", help="trained JoeyNMT Transformer checkpoint")
    p.add_argument("--joey-ckpt-rnn", help="trained JoeyNMT RNN checkpoint")
    p.add_argument("--ckpt-transformer", help="trained nmt Transformer checkpoint")
    p.add_argument("--ckpt-gru", help="trained nmt GRU checkpoint")
    p.add_argument(
        "--nmt-weights",
        choices=["auto", "random"],
        default="auto",
        help="auto: nmt decodes --ckpt-* or the newest run; random: untrained weights",
    )
    p.add_argument("--threads", type=int, default=2, help="threads of each toolkit (default 2)")
    p.add_argument("--rounds", type=int, default=2, help="training rounds, ABAB (default 2)")
    p.add_argument("--steps", type=int, help="nmt timed steps per segment (default 20, quick 3)")
    p.add_argument("--warmup", type=int, help="nmt untimed steps first (default 3, quick 1)")
    p.add_argument(
        "--joey-steps-transformer",
        type=int,
        help="JoeyNMT Transformer updates per segment (default 40, quick 5)",
    )
    p.add_argument(
        "--joey-steps-rnn", type=int, help="JoeyNMT RNN updates per segment (default 60, quick 5)"
    )
    p.add_argument(
        "--joey-warmup",
        type=int,
        help="JoeyNMT steps left out first (default 5, quick 2; at least one logging window)",
    )
    p.add_argument("--joey-logging-freq", type=int, default=1, help="JoeyNMT logging_freq")
    p.add_argument(
        "--joey-timeout", type=float, default=1800, help="seconds before a JoeyNMT run is killed"
    )
    p.add_argument(
        "--precision",
        default="32,bf16",
        help="nmt training precisions, comma-separated (32, bf16; default both)",
    )
    p.add_argument("--max-tokens-transformer", type=int, help="nmt data.max_tokens (no matching)")
    p.add_argument("--max-tokens-gru", type=int, help="nmt data.max_tokens (no matching)")
    p.add_argument("--sentences", type=int, help="test sentences decoded (default 1000, quick 50)")
    p.add_argument(
        "--max-output-length",
        type=int,
        default=60,
        help="decoder steps per sentence at most, EOS included (default 60, JoeyNMT's configs)",
    )
    p.add_argument(
        "--fixed-length",
        action="store_true",
        help="block EOS until the cap in both toolkits (JoeyNMT min_output_length, nmt "
        "min_output_len): every output has the same length, so trained and untrained weights "
        "do the same work",
    )
    p.add_argument("--no-train", action="store_true", help="skip the training comparison")
    p.add_argument("--no-decode", action="store_true", help="skip the decoding comparison")
    p.add_argument("--runs", default=str(REPO / "outputs/runs"), help="where nmt runs are")
    p.add_argument(
        "--data-root",
        default=str(REPO / "data"),
        help="data.root for Multi30k (nmt's data, and the source of JoeyNMT's data/ files)",
    )
    p.add_argument(
        "--out",
        default=str(REPO / "outputs/bench/joeynmt-vs-nmt-<time>.json"),
        help="JSON output (default outputs/bench/joeynmt-vs-nmt-<time>.json)",
    )
    p.add_argument("--quick", action="store_true", help="a smoke run: few steps and sentences")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    s = joeynmt_setup.make_settings(**vars(parse_args(argv)))
    try:
        result = joeynmt.compare(s)
    except SetupError as err:
        print(err, file=sys.stderr)
        return 2
    write_result(s.out, result, joeynmt_report.report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

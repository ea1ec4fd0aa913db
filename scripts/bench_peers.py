"""Training speed of nmt beside Eole, Marian and JoeyNMT on this CPU: ``make bench-peers``
(benchmarks.peers).

    python scripts/bench_peers.py                     # every peer, both models, 3 rounds
    python scripts/bench_peers.py --peers eole --models transformer --quick
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# benchmarks/ and docs/hooks/ live beside the package, at the checkout's root
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from benchmarks import peers
from benchmarks.report import SetupError, json_out, write_result

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=peers.__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--peers", default="eole,marian,joeynmt", help="comma-separated peers")
    p.add_argument("--models", default="transformer,gru", help="transformer and/or gru")
    p.add_argument(
        "--precision",
        default="32,bf16,auto",
        help="precisions timed where offered (auto: nmt's own choice)",
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds, the toolkits' order rotating")
    p.add_argument("--steps", type=int, default=60, help="updates per training process")
    p.add_argument("--skip", type=int, default=10, help="first updates left out (warm-up)")
    p.add_argument("--log-every", type=int, default=5, help="updates per log window")
    p.add_argument("--tgt-tokens", type=int, default=3500, help="target tokens per update")
    p.add_argument(
        "--calibrate-steps",
        type=int,
        default=0,
        help="updates of a batch calibration run (0: none)",
    )
    p.add_argument("--threads", type=int, default=2, help="threads of every toolkit")
    p.add_argument(
        "--venvs", default=str(REPO / "outputs/peers/venvs"), help="the peers' virtual envs"
    )
    p.add_argument("--work", default=str(REPO / "outputs/peers/work"), help="runs' files")
    p.add_argument("--data-root", default=str(REPO / "data"), help="nmt's data.root")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before a run is killed")
    p.add_argument("--out", help="JSON output (default outputs/bench/peers-<time>.json)")
    p.add_argument(
        "--quality-minutes",
        type=float,
        default=30,
        help="BLEU after this many minutes of nmt's training, each peer given the same "
        "wall-clock time (0: none; default 30)",
    )
    p.add_argument(
        "--quality-continue",
        help="an earlier run's JSON, or <work>/quality-progress.json: its toolkits whose "
        "outputs are still there are kept, with its budget; the others train",
    )
    p.add_argument(
        "--quality-redecode",
        default="",
        help="with --quality-continue: kept toolkits (nmt,eole,...) whose models are converted "
        "and decoded again, every way, as after a change to their decoding",
    )
    p.add_argument("--no-speed", action="store_true", help="skip the training-speed rounds")
    p.add_argument(
        "--quick", action="store_true", help="a smoke run: one round, 12 updates, 2 minutes"
    )
    return p.parse_args(argv)


def split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def earlier(path: str | None) -> dict | None:
    """The quality section of an earlier run's JSON or progress file."""
    if path is None:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SystemExit(f"--quality-continue {path}: {err}") from err
    section = data.get("quality", data) if isinstance(data, dict) else None
    if not isinstance(section, dict) or not isinstance(section.get("toolkits"), dict):
        raise SystemExit(f"--quality-continue {path}: no 'toolkits' of a quality comparison")
    return section


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    s = peers.Settings(
        peers=split(a.peers),
        models=split(a.models),
        precisions=split(a.precision),
        rounds=a.rounds,
        steps=a.steps,
        skip=a.skip,
        log_every=a.log_every,
        tgt_tokens=a.tgt_tokens,
        calibrate_steps=a.calibrate_steps,
        threads=a.threads,
        venvs=Path(a.venvs).resolve(),
        work=Path(a.work).resolve(),
        data_root=Path(a.data_root),
        timeout=a.timeout,
        out=json_out(a.out, "peers", REPO),
        python=Path(sys.executable),
        speed=not a.no_speed,
        quality_minutes=a.quality_minutes,
        quality_done=earlier(a.quality_continue),
        quality_redecode=split(a.quality_redecode),
    )
    if a.quick:
        s = peers.with_quick(s)
    try:
        result = peers.compare(s)
    except SetupError as err:
        print(err, file=sys.stderr)
        return 2
    write_result(s.out, result, peers.report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

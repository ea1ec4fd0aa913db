"""Fine-tuning and decoding an imported model beside transformers' Seq2SeqTrainer and
generate: ``make bench-hf-trainer`` (benchmarks.hf_trainer).

python scripts/bench_hf_trainer.py                  # 3 alternating rounds, fp32 and bf16
python scripts/bench_hf_trainer.py --quick          # a tiny model, one round: the bench works
python scripts/bench_hf_trainer.py --parts decode   # decoding only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# benchmarks/ and docs/hooks/ live beside the package, at the checkout's root
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from benchmarks import hf_trainer
from benchmarks.report import json_out, write_json
from nmt.data.corpus import fetch_multi30k
from nmt.environment import multi30k_source

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=f"{__doc__}\n{hf_trainer.__doc__}",
                                     formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--updates", type=int, default=16, help="updates per fine-tuning run")
    parser.add_argument("--skip", type=int, default=3, help="first updates of a run not counted")
    parser.add_argument("--max-tokens", type=int, default=2048, help="tokens per batch")
    parser.add_argument("--precisions", default="32,bf16", help="comma-separated")
    parser.add_argument("--parts", default="train,decode", help="train, decode or both")
    parser.add_argument("--quick", action="store_true", help="a tiny model, one short round")
    parser.add_argument("--work", default=str(REPO / "outputs" / "bench" / "hf-trainer"))
    parser.add_argument("--data-root", default="data", help="where Multi30k is (or is fetched)")
    parser.add_argument("--out", default=None, help="the JSON file")
    args = parser.parse_args(argv)
    multi30k = fetch_multi30k(Path(args.data_root), ("de", "en"), ["train", "test_2016_flickr"],
                              multi30k_source())  # fmt: skip
    s = hf_trainer.Settings(
        work=Path(args.work), multi30k=multi30k, cwd=REPO, rounds=args.rounds,
        updates=args.updates, skip=args.skip, max_tokens=args.max_tokens,
        precisions=[p for p in args.precisions.split(",") if p], quick=args.quick,
    )  # fmt: skip
    if args.quick:
        s.rounds, s.updates, s.skip, s.pairs = 1, 4, 1, 200
        s.decode_sentences, s.decode_rounds, s.decode_length = 16, 1, 4
    result = hf_trainer.run(s, tuple(p for p in args.parts.split(",") if p))
    result["command"] = [sys.argv[0], *(argv if argv is not None else sys.argv[1:])]
    out = json_out(args.out, "bench-hf-trainer", REPO)
    write_json(out, result)
    print(hf_trainer.report(result))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

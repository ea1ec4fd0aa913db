"""Fine-tuning a model of NLLB-200-distilled-600M's shape: ``make bench-finetune``
(benchmarks.finetune_scale).

python scripts/bench_finetune.py                              # 4 updates in bf16
python scripts/bench_finetune.py --freeze embeddings,encoder  # the decoder alone trains
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# benchmarks/ and docs/hooks/ live beside the package, at the checkout's root
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from benchmarks import finetune_scale
from benchmarks.report import json_out, write_json
from nmt.data.corpus import fetch_multi30k
from nmt.environment import multi30k_source

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=f"{__doc__}\n{finetune_scale.__doc__}",
                                     formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    parser.add_argument("--updates", type=int, default=4, help="updates (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=2048, help="data.max_tokens")
    parser.add_argument("--precision", default="bf16", help="trainer.precision")
    parser.add_argument("--freeze", default="", help="trainer.freeze, comma-separated")
    parser.add_argument("--work", default=str(REPO / "outputs" / "bench" / "finetune"))
    parser.add_argument("--data-root", default="data", help="where Multi30k is (or is fetched)")
    parser.add_argument("--out", default=None, help="the JSON file")
    args = parser.parse_args(argv)
    multi30k = fetch_multi30k(Path(args.data_root), ("de", "en"), ["train"], multi30k_source())
    s = finetune_scale.FinetuneSettings(
        work=Path(args.work), multi30k=multi30k, cwd=REPO, updates=args.updates,
        max_tokens=args.max_tokens, precision=args.precision,
        freeze=[p for p in args.freeze.split(",") if p],
    )  # fmt: skip
    result = finetune_scale.run(s)
    result["command"] = [sys.argv[0], *(argv if argv is not None else sys.argv[1:])]
    out = json_out(args.out, "bench-finetune", REPO)
    write_json(out, result)
    print(finetune_scale.report(result))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

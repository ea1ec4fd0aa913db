"""Check a run's Hugging Face export against our decoding on the run's test set (make check-hf).

Exports the checkpoint with ``nmt-export --format hf`` into a temporary folder (or reads
``--folder``), then compares greedy tokens, beam-search BLEU and the strings a user gets
(:mod:`nmt.ship.hf_check`). Prints the JSON report (and writes it to ``--out``); exit status 0
when every check holds, 1 when one does not, 2 on a usage error::

    python scripts/check_hf.py outputs/runs/<run> --out outputs/check-hf.json
    python scripts/check_hf.py outputs/runs/<run> --length-penalty 0.75 --early-stopping never
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from nmt.cli import exit_on_error, setup_logging

log = logging.getLogger("check_hf")


def generate_options(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of transformers' beam search that the command line replaces."""
    options: dict[str, Any] = {}
    if args.length_penalty is not None:
        options["length_penalty"] = args.length_penalty
    if args.early_stopping is not None:
        stop = {"true": True, "false": False, "never": "never"}
        options["early_stopping"] = stop[args.early_stopping]
    return options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", nargs="?", default="outputs/latest", help="run directory")
    parser.add_argument("--ckpt", help="checkpoint file or name; default: as nmt-eval")
    parser.add_argument("--folder", type=Path, help="an existing --format hf export of it")
    parser.add_argument("--limit", type=int, default=0, help="first N test sentences (0: all)")
    parser.add_argument("--beam", type=int, help="beam of the BLEU check (default: the run's)")
    parser.add_argument(
        "--length-penalty", type=float, help="transformers' length_penalty in the beam check "
        "(default: the folder's, the run's alpha)",
    )  # fmt: skip
    parser.add_argument(
        "--early-stopping", choices=("true", "false", "never"),
        help="transformers' early_stopping in the beam check (default: the folder's, false)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    args = parser.parse_args(argv)
    # PyTorch and transformers load once the command line is known good (a usage error or
    # --help answers at once)
    from nmt.ship.hf_check import check_run
    from nmt.store.paths import checkpoint_path, resolve_run_dir

    setup_logging()
    with exit_on_error(log):
        ckpt = checkpoint_path(resolve_run_dir(args.run), args.ckpt)
        report = check_run(ckpt, args.folder, args.limit, args.beam, generate_options(args))
    text = json.dumps(report, indent=2) + "\n"
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    print(text, end="")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""``nmt-import SOURCE --out DIR``: a pretrained transformers model as a run directory.

SOURCE is a local ``MarianMTModel`` folder (an OPUS-MT model) or
``M2M100ForConditionalGeneration`` folder (M2M100, NLLB-200), or a Hugging Face Hub id, which
``huggingface_hub`` resolves into its cache where the machine has the network; the run is
written by :mod:`nmt.store.hf_run`, whole or not at all.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from nmt.cli import exit_on_error, setup_logging
from nmt.store.hf_run import import_folder, resolve_source, run_config, write_run

log = logging.getLogger("nmt.import")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nmt-import",
        description="Import a pretrained transformers MarianMTModel (OPUS-MT) or "
        "M2M100ForConditionalGeneration as a run directory that nmt-translate, nmt-eval, "
        "nmt-export, nmt-serve and fine-tuning read.",
    )
    parser.add_argument("source", help="a local model folder, or a Hub id (needs the network)")
    parser.add_argument("--out", required=True, type=Path, help="the run directory to write")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    setup_logging()
    with exit_on_error(log):
        folder = resolve_source(args.source)
        imported, data, said = import_folder(folder)
        write_run(imported, run_config(imported, data), args.out, str(folder))
    params = sum(p.numel() for p in imported.model.parameters())
    print(f"imported {args.source} ({params / 1e6:.1f}M parameters, {said}) "
          f"as the run {args.out}")  # fmt: skip
    print(
        f'fine-tune it on your data: make train ARGS="experiment=finetune '
        f'trainer.init_from={args.out} data=parallel data.train=... data.valid=..." (the '
        "architecture comes with it)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

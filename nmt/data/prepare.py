"""Prepare the training data once: ``nmt-prepare`` / ``make prepare ARGS="..."``.

Composes the same config as ``nmt-train`` (so ``data=...`` and every other override mean the
same) and only prepares the training corpora into ``<data.root>/cache/prepared/<key>/``
(:mod:`nmt.data.binarize`); ``nmt-train`` then maps that directory at start-up. A training
run does this step itself when it finds no sound preparation, so running it first is only
needed to prepare ahead (a large corpus, before several runs or a multi-GPU job).

    nmt-prepare data=parallel data.src_lang=de data.tgt_lang=en \\
        data.train=/corpus/train data.valid=/corpus/dev
    nmt-prepare --verify          # check every checksum of the existing preparation too

Prints the prepared directory on stdout; progress and statistics go to the log (stderr), and
on a terminal a bar shows each pass over a corpus (``trainer.progress=false``: none).
Torch is not imported here: the preparing process and its workers stay small.
"""

from __future__ import annotations

import argparse
import logging
import sys

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from nmt.cli import Progress, config_dir, exit_on_error, setup_logging
from nmt.config import register_configs
from nmt.config_checks import check_train_config
from nmt.data.binarize import ensure_prepared
from nmt.data.multilingual import directions_of
from nmt.data.multiprep import ensure_multi_prepared
from nmt.environment import multi30k_source

log = logging.getLogger(__name__)


def make_parser() -> argparse.ArgumentParser:
    """``nmt-prepare``'s command line."""
    parser = argparse.ArgumentParser(
        prog="nmt-prepare",
        description="Prepare the training corpora of a training config into the binarized, "
        "memory-mapped cache that nmt-train reads.",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="also check every checksum of an existing preparation and re-read the inputs' "
        "checksums; a damaged preparation is reported and rebuilt",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for nmt-train")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Prepare (or check) the training data of a training config; the exit status."""
    args = make_parser().parse_args(argv)
    setup_logging()
    register_configs()
    with exit_on_error(log, HydraException, OmegaConfBaseException):
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            cfg = compose(config_name="train", overrides=args.overrides)
        check_train_config(cfg)
        prepare = ensure_multi_prepared if directions_of(cfg.data) else ensure_prepared
        cache = prepare(
            cfg.data,
            verify=args.verify,
            source=multi30k_source(),
            progress=Progress(cfg.trainer.progress),
        )
    print(cache.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

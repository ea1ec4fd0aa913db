"""Digests of checkpoints' deterministic parts (nmt.store.checkpoint.content_digest), one line each.

A change that must not alter training (a refactoring) keeps them equal: train the same short
run with a fixed seed before and after the change, and compare the lines::

    nmt-train trainer.seed=7 trainer.threads=1 trainer.precision=32 trainer.max_steps=30 \\
        trainer.val_every=15 trainer.val_sentences=200 trainer.keep_last=2 \\
        trainer.average_last=2 hydra.run.dir=/tmp/digest-run
    python scripts/checkpoint_digest.py /tmp/digest-run/checkpoints/*.pt
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nmt.store.checkpoint import content_digest, load_checkpoint
from nmt.store.gate import CheckpointError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoints", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for path in args.checkpoints:
        try:
            digest = content_digest(load_checkpoint(path))
        except CheckpointError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{path.name} {json.dumps(digest)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

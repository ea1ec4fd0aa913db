"""``python -m nmt.evaluate``: ``nmt-eval``."""

from nmt.evaluate.scoring import main

main()

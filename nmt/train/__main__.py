"""``python -m nmt.train``: ``nmt-train`` (torchrun runs it so: ``make train NPROC=N``)."""

from nmt.train.command import main

main()

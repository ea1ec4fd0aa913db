"""``python -m nmt.serve``: the same as ``nmt-serve``."""

from nmt.serve.main import main

main()

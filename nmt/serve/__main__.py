"""``python -m nmt.serve``: the same as ``nmt-serve``."""

from nmt.serve.main import main

if __name__ == "__main__":  # a decoding process imports this module again: it must not serve
    main()

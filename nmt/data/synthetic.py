"""Large synthetic parallel corpora made of real sentences, for scale tests and benchmarks.

Copy 0 of a source corpus is written as it is; copy ``c >= 1`` appends `` (c)`` to both sides
of every pair, so every copy's lines differ from the others' while keeping real sentence
structure and lengths. Written a block at a time: memory stays small for any size.
"""

from __future__ import annotations

import contextlib
import gzip
import os
from pathlib import Path

from nmt.data.corpus import iter_parallel_blocks, read_parallel


def write_numbered_copies(
    src_path: str | Path,
    tgt_path: str | Path,
    prefix: str | Path,
    langs: tuple[str, str],
    pairs: int,
    gz: bool = False,
) -> tuple[Path, Path]:
    """Write ``pairs`` pairs of numbered copies of a parallel corpus to ``<prefix>.<lang>``.

    ``gz`` writes ``<prefix>.<lang>.gz`` instead. Returns the two paths. The files are written
    under temporary names and renamed, so a partial corpus never appears under the final names.
    """
    if pairs <= 0:
        raise ValueError(f"pairs={pairs} must be > 0")
    base_src, base_tgt = read_parallel(src_path, tgt_path)
    if not base_src:
        raise ValueError(f"{src_path} is empty")
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    paths = (Path(f"{prefix}.{langs[0]}{suffix}"), Path(f"{prefix}.{langs[1]}{suffix}"))
    temps = [p.with_name(f".{p.name}.part") for p in paths]
    opener = gzip.open if gz else open
    try:
        with contextlib.ExitStack() as stack:
            fs, ft = (stack.enter_context(opener(t, "wt", encoding="utf-8")) for t in temps)
            left, copy = pairs, 0
            while left > 0:
                take = min(left, len(base_src))
                tag = f" ({copy})" if copy else ""
                fs.write("".join(f"{line}{tag}\n" for line in base_src[:take]))
                ft.write("".join(f"{line}{tag}\n" for line in base_tgt[:take]))
                left -= take
                copy += 1
        for tmp, path in zip(temps, paths, strict=True):
            os.replace(tmp, path)
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
    return paths


def count_pairs(src_path: str | Path, tgt_path: str | Path) -> int:
    """Line pairs of a parallel corpus, read a block at a time."""
    return sum(len(s) for s, _ in iter_parallel_blocks(src_path, tgt_path))

"""The prepared-data cache: reuse and keys, memory-mapped batches, verification and recovery
from damage, the nmt-prepare command, and preparations killed at random moments."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from nmt.data import batching, binarize, cache
from nmt.data.batching import (
    BatchList,
    TokenBatchSampler,
    TokenDataset,
    make_batch,
    padding_share,
)
from nmt.data.binarize import ensure_prepared
from nmt.data.cache import CacheError, open_prepared
from nmt.data.datasets import prepare_data
from nmt.data.synthetic import count_pairs, write_numbered_copies
from nmt.data.tokenizer import TokenizerPair

from .helpers import REPO, data_cfg, in_memory


def array_digests(cache_dir: Path) -> dict[str, str]:
    manifest = json.loads((cache_dir / "manifest.json").read_text())
    return {name: info["sha256"] for name, info in manifest["arrays"].items()}


def final_dirs(root: Path) -> list[Path]:
    base = root / "cache" / "prepared"
    return sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))


def flip_byte(path: Path, offset: int) -> None:
    """Change one byte in place (a negative offset counts from the end)."""
    offset = offset if offset >= 0 else path.stat().st_size + offset
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x5A]))


# --------------------------------------------------------------------------- the cache


def test_second_open_reads_nothing_and_option_changes_give_new_keys(
    real_corpus: Path, joint_tok: TokenizerPair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = data_cfg(str(real_corpus), tmp_path)
    first = ensure_prepared(cfg, joint_tok)
    assert final_dirs(tmp_path) == [first.path]

    def no_reading(*args, **kwargs):
        raise AssertionError("read the corpus again")

    with monkeypatch.context() as m:
        m.setattr(binarize, "iter_parallel_blocks", no_reading)
        m.setattr(cache, "sha256_file", no_reading)  # inputs known by their stat
        assert ensure_prepared(cfg, joint_tok).path == first.path
    shorter = ensure_prepared(data_cfg(str(real_corpus), tmp_path, max_len=20), joint_tok)
    assert shorter.path != first.path and shorter.pairs < first.pairs
    # an edited input (same size, other bytes) is a new key
    src = Path(f"{real_corpus}.de")
    copy = tmp_path / "copy"
    shutil.copy(src, f"{copy}.de")
    shutil.copy(f"{real_corpus}.en", f"{copy}.en")
    same = ensure_prepared(data_cfg(str(copy), tmp_path), joint_tok)
    assert same.path == first.path  # the key is the content, not the path
    text = Path(f"{copy}.de").read_text().replace("Hund", "Hand", 1)
    Path(f"{copy}.de").write_text(text)
    assert ensure_prepared(data_cfg(str(copy), tmp_path), joint_tok).path != first.path


def test_resumed_run_reuses_the_preparation_of_its_own_tokenizer(
    real_corpus: Path, tmp_path: Path
) -> None:
    cfg = data_cfg(str(real_corpus), tmp_path)
    trained = prepare_data(cfg)
    again = prepare_data(
        cfg, tokenizers=TokenizerPair.from_state_dict(trained.tokenizers.state_dict())
    )
    assert again.cache_dir == trained.cache_dir and len(final_dirs(tmp_path)) == 1


def test_memory_mapped_batches_equal_in_memory_ones(real_corpus: Path, joint_tok, tmp_path) -> None:
    data = prepare_data(data_cfg(str(real_corpus), tmp_path), joint_tok)
    src_ids, tgt_ids, _ = in_memory(real_corpus, joint_tok)
    plain = TokenDataset(src_ids, tgt_ids)
    assert not data.train._src.flat.flags.writeable  # read-only memory map
    sampler = TokenBatchSampler(data.train.src_lens, data.train.tgt_lens, 800, seed=3)
    reference = TokenBatchSampler(plain.src_lens, plain.tgt_lens, 800, seed=3)
    assert sampler.batches(0) == reference.batches(0)
    compact = sampler.batches(0)  # a BatchList: padding counted with array operations
    assert isinstance(compact, BatchList)
    assert padding_share(data.train, compact) == pytest.approx(
        padding_share(plain, [list(b) for b in compact]), abs=1e-12
    )
    assert padding_share(data.train, compact[3:9]) == pytest.approx(
        padding_share(plain, list(compact[3:9])), abs=1e-12
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. torch's warning about non-writable arrays
        for idx in sampler.batches(0)[:20]:
            a, b = make_batch(data.train, idx), make_batch(plain, idx)
            for name in ("src", "src_lens", "tgt_in", "tgt_out", "index", "tgt_positions"):
                assert getattr(a, name).equal(getattr(b, name)), name


def resident_in_mappings_of(directory: Path) -> int:
    """Bytes of this process's page tables that map files under ``directory`` (the ``Rss`` of
    those mappings): unlike the process's file-backed PSS, other processes starting or ending
    do not change it."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        words = line.split()
        if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):  # a mapping's header: address ... path
            inside = len(words) >= 6 and words[5].startswith(f"{directory}/")
        elif inside and words[0] == "Rss:":
            total += int(words[1]) * 1024  # kB
    return total


def test_reading_a_large_mapped_side_keeps_its_pages_unmapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over a whole epoch of batches, a memory-mapped side larger than RELEASE_ABOVE adds no
    mapped pages to the process (they would add the whole file without the release)."""
    rng = np.random.default_rng(0)
    lens = rng.integers(5, 40, 400_000).astype(np.int32)  # (N,)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    tokens = rng.integers(4, 8000, int(offsets[-1])).astype(np.uint16)  # about 18 MB
    for name, arr in (("tokens", tokens), ("offsets", offsets), ("lengths", lens)):
        np.save(tmp_path / f"{name}.npy", arr)
        (tmp_path / f"{name}.npy").read_bytes()  # in the page cache, as after a preparation

    def side() -> tuple[np.ndarray, ...]:
        return tuple(
            np.load(tmp_path / f"{n}.npy", mmap_mode="r") for n in ("tokens", "offsets", "lengths")
        )

    batches = TokenBatchSampler(lens, lens, 4096, seed=0).batches(0)
    growth = {}
    for bound in (1 << 40, 16 << 20):  # never release, then release (the files exceed 16 MB)
        monkeypatch.setattr(batching, "RELEASE_ABOVE", bound)
        ds = TokenDataset.from_arrays(side(), side())
        before = resident_in_mappings_of(tmp_path)
        for idx in batches:
            make_batch(ds, idx)
        growth[bound] = resident_in_mappings_of(tmp_path) - before
        del ds
    # most of the files both sides read became mapped (the sides share them: about 22 MB)
    files = sum((tmp_path / f"{n}.npy").stat().st_size for n in ("tokens", "offsets", "lengths"))
    assert growth[1 << 40] > 0.8 * files
    assert growth[16 << 20] < 2 << 20


DAMAGE = {
    "array cut short": (lambda d: truncate(d / "src.tokens.npy", -3), "src.tokens.npy: .* bytes"),
    "array extended": (lambda d: append(d / "tgt.lengths.npy", b"\0\0\0\0"), "tgt.lengths.npy: "),
    "last byte flipped": (lambda d: flip_byte(d / "tgt.tokens.npy", -1), "last bytes do not match"),
    "array missing": (lambda d: (d / "src.offsets.npy").unlink(), r"src\.offsets\.npy: missing"),
    "header edited": (lambda d: edit_header(d / "tgt.offsets.npy"), r"tgt\.offsets\.npy: holds"),
    "manifest not json": (lambda d: truncate(d / "manifest.json", 40), "manifest.json: not valid"),
    "manifest counts": (lambda d: edit_manifest(d, pairs=5), "do not add up"),
    "model flipped": (lambda d: flip_byte(d / "spm.model", 100), r"spm\.model: sha256"),
    "middle byte flipped": (
        lambda d: flip_byte(d / "src.tokens.npy", 200),
        r"src\.tokens\.npy: sha256",
    ),
}


def truncate(path: Path, size: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:size] if size >= 0 else data[: len(data) + size])


def append(path: Path, extra: bytes) -> None:
    with open(path, "ab") as f:
        f.write(extra)


def edit_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    at = data.index(b"'<i8'")
    data[at : at + 5] = b"'<u8'"
    path.write_bytes(bytes(data))


def edit_manifest(cache_dir: Path, **changes: object) -> None:
    path = cache_dir / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_cache_is_reported_and_rebuilt(
    real_corpus: Path,
    joint_tok: TokenizerPair,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    damage: str,
) -> None:
    cfg = data_cfg(str(real_corpus), tmp_path)
    good = ensure_prepared(cfg, joint_tok)
    before = array_digests(good.path)
    del good
    harm, message = DAMAGE[damage]
    harm(final_dirs(tmp_path)[0])
    caplog.set_level(logging.INFO, logger="nmt.data")
    full = damage == "middle byte flipped"  # only the checksums see it
    if full:
        damaged = final_dirs(tmp_path)[0]
        assert (damaged / "src.tokens.npy").stat().st_size > cache.TAIL_BYTES + 1000
        with pytest.raises(CacheError, match=message):
            open_prepared(damaged, full=True)
        open_prepared(damaged)  # the quick check at every open does not read the middle
    rebuilt = ensure_prepared(cfg, joint_tok, verify=full)
    assert "rebuilding" in caplog.text
    warning = next(r for r in caplog.records if "rebuilding" in r.getMessage())
    assert warning.levelno == logging.WARNING
    assert re.search(message, warning.getMessage()), warning.getMessage()
    assert array_digests(rebuilt.path) == before
    open_prepared(rebuilt.path, full=True)
    assert final_dirs(tmp_path) == [rebuilt.path]
    leftovers = [p.name for p in (tmp_path / "cache" / "prepared").iterdir()]
    assert sorted(leftovers) == sorted([rebuilt.path.name, "inputs.json"])  # no lock, no temp


def test_nmt_prepare_command(real_corpus: Path, tmp_path: Path) -> None:
    overrides = [
        "data=parallel", "data.src_lang=de", "data.tgt_lang=en", f"data.train={real_corpus}",
        f"data.valid={real_corpus}", f"data.root={tmp_path}", "data.vocab_size=600",
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "nmt.data.prepare", *overrides]
    first = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    path = Path(first.stdout.strip())
    assert path.parent == tmp_path / "cache" / "prepared" and (path / "manifest.json").is_file()
    assert "train train0_3000: read 3004, dropped empty 2" in first.stderr
    flip_byte(path / "tgt.tokens.npy", 300)
    check = subprocess.run([*cmd[:3], "--verify", *overrides], cwd=REPO, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert check.returncode == 0, check.stderr[-3000:]
    assert f"{path / 'tgt.tokens.npy'}: sha256 does not match the manifest" in check.stderr
    assert Path(check.stdout.strip()) == path
    open_prepared(path, full=True)
    bad = subprocess.run([*cmd, "data.max_len=0"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "data.max_len=0 must be > 0" in bad.stderr
    probe = "import sys, nmt.data.prepare; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=REPO).stdout.strip() == "False"  # fmt: skip


# --------------------------------------------------------------------------- killed preparations


def wait_for(proc: subprocess.Popen, ready: Callable[[], bool], limit: float = 300) -> bool:
    """Poll ``ready`` until it holds (True) or the process ends (False)."""
    deadline = time.monotonic() + limit
    while proc.poll() is None and time.monotonic() < deadline:
        if ready():
            return True
        time.sleep(0.003)
    return False


@pytest.mark.slow(seconds=19)
def test_preparation_killed_at_random_moments_never_leaves_a_used_cache(
    multi30k: Path, tmp_path: Path
) -> None:
    """SIGKILL (the preparing process and its two workers) at random moments and in each phase:
    sampling and sentencepiece, encoding, between the manifest and the rename. Whatever is under
    a final name verifies fully; the next run cleans up and builds the same arrays."""
    src, tgt = write_numbered_copies(
        multi30k / "train.de.gz", multi30k / "train.en.gz", tmp_path / "big", ("de", "en"), 70_000
    )
    assert count_pairs(src, tgt) == 70_000
    root = tmp_path / "root"
    base = root / "cache" / "prepared"
    overrides = [
        "data=parallel", "data.src_lang=de", "data.tgt_lang=en", f"data.train={tmp_path / 'big'}",
        f"data.valid={tmp_path / 'big'}", f"data.root={root}", "data.vocab_size=600",
        "data.spm_sample=3000", "data.num_workers=2",
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "nmt.data.prepare", *overrides]
    log_file = tmp_path / "prepare.log"

    def spawn() -> subprocess.Popen:
        with open(log_file, "a") as out:
            out.write("\n===== start\n")
            return subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip

    def log_has(text: str) -> Callable[[], bool]:
        start = log_file.stat().st_size
        return lambda: text in log_file.read_text()[start:]

    def encoding() -> bool:
        return any(p.stat().st_size > 4096 for p in base.glob(".tmp-*/src.tokens.npy"))

    def manifest() -> bool:
        return any(base.glob(".tmp-*/manifest.json"))

    tic = time.monotonic()
    ref = subprocess.run([*cmd, f"data.root={tmp_path / 'reference'}"], cwd=REPO,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    duration = time.monotonic() - tic
    assert ref.returncode == 0, ref.stderr[-3000:]
    expected = array_digests(Path(ref.stdout.strip()))

    rng = random.Random(20241201)
    kinds = ["random"] * 4 + ["sentencepiece", "encoding", "manifest"]
    rng.shuffle(kinds)
    killed: dict[str, int] = {}
    report = []
    for kind in kinds:
        for _attempt in range(4):  # a kill aimed at a short phase can come too late
            proc = spawn()
            if kind == "random":
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=rng.uniform(0.3, duration))
            else:
                ready = {"sentencepiece": log_has("sentencepiece sample:"),
                         "encoding": encoding, "manifest": manifest}[kind]  # fmt: skip
                if wait_for(proc, ready) and kind != "manifest":
                    time.sleep(rng.uniform(0.0, 0.3))
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the preparing process and its workers
            proc.wait(timeout=60)
            on_disk = sorted(p.name[:12] for p in base.iterdir()) if base.is_dir() else []
            report.append(f"{kind}: exit {proc.returncode}, then {on_disk}")
            for final in final_dirs(root) if base.is_dir() else []:
                # anything under a final name is complete and verifies; rebuild it next time
                assert array_digests(open_prepared(final, full=True).path) == expected, report
                shutil.rmtree(final)
                shutil.rmtree(root / "cache" / "spm", ignore_errors=True)
            if proc.returncode == -signal.SIGKILL:
                killed[kind] = killed.get(kind, 0) + 1
                break
    assert set(killed) == set(kinds) and sum(killed.values()) >= 6, report
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert array_digests(Path(done.stdout.strip())) == expected
    left = [p.name for p in base.iterdir() if p.name.startswith(".")]
    assert left == [], (left, report)  # temporary directories and locks of the kills swept

"""Token-id datasets held as flat tensors, padded batches, and token-budget batch samplers.

The cost of a batch is ``n_sentences * max(longest source + 1, longest target + 1)``: the
number of positions of its larger padded side (source + EOS, or BOS/EOS + target).
"""

from __future__ import annotations

import itertools
import mmap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import overload

import numpy as np
import torch
from torch import Tensor

from nmt.data.corpus import DataError
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

RELEASE_ABOVE = 64 << 20  # bytes of a memory-mapped side above which read pages are unmapped


def _mapping(arr: np.ndarray) -> mmap.mmap | None:
    """The memory map behind an array that ``numpy.load(mmap_mode=...)`` returned, if any."""
    m = getattr(arr, "_mmap", None)
    return m if isinstance(m, mmap.mmap) and hasattr(m, "madvise") else None


class _Side:
    """One side of a corpus: all ids in one flat array plus per-sentence offsets and lengths.

    The arrays may be memory-mapped, read-only files (a prepared cache): sentences are read by
    numpy indexing, and only the small results become tensors. When a side's files exceed
    RELEASE_ABOVE bytes, the mapped pages leave this process's page tables after each read
    (``MADV_DONTNEED``; they stay in the page cache, which every rank shares): the kernel maps
    64 KB around each page read, so the resident memory of a run would otherwise grow by the
    whole cache over an epoch. Smaller sides stay mapped (re-reading costs about 0.5 ms a batch).
    """

    def __init__(
        self, flat: np.ndarray, offsets: np.ndarray, lens: np.ndarray | None = None
    ) -> None:
        self.flat = flat  # (total_tokens,) integer ids (int32, or uint16 in a prepared cache)
        self.offsets = offsets  # (N + 1,) int64; sentence i is flat[offsets[i]:offsets[i + 1]]
        self.lens = np.diff(offsets) if lens is None else lens  # (N,) integer
        maps = [m for m in map(_mapping, (self.flat, self.offsets, self.lens)) if m is not None]
        self._maps = maps if sum(len(m) for m in maps) > RELEASE_ABOVE else []

    def release(self) -> None:
        """Unmap the pages read so far (a no-op for arrays in memory)."""
        for m in self._maps:
            m.madvise(mmap.MADV_DONTNEED)

    @classmethod
    def from_lists(cls, seqs: Sequence[Sequence[int]]) -> _Side:
        lens = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))  # (N,)
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)  # (N + 1,)
        np.cumsum(lens, out=offsets[1:])
        flat = np.fromiter(
            itertools.chain.from_iterable(seqs), dtype=np.int32, count=int(offsets[-1])
        )  # (total_tokens,)
        return cls(flat, offsets, lens)

    def item(self, i: int) -> Tensor:
        ids = np.array(self.flat[int(self.offsets[i]) : int(self.offsets[i + 1])], dtype=np.int32)
        self.release()
        return torch.from_numpy(ids)

    def subset(self, idx: np.ndarray) -> _Side:
        lens = np.asarray(self.lens[idx], dtype=np.int64)  # (M,)
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)  # (M + 1,)
        np.cumsum(lens, out=offsets[1:])
        # position k of new sentence j comes from flat[old_start[j] + k]
        shift = np.repeat(self.offsets[idx] - offsets[:-1], lens)  # (total,)
        positions = np.arange(int(offsets[-1]), dtype=np.int64) + shift  # (total,)
        return _Side(np.asarray(self.flat[positions], dtype=np.int32), offsets, lens)

    def gather(self, idx: np.ndarray) -> tuple[Tensor, Tensor]:
        """Sentences ``idx`` as (B, L) int64 right-padded with PAD, and their (B,) lengths."""
        lens = np.asarray(self.lens[idx], dtype=np.int64)  # (B,)
        width = int(lens.max()) if len(idx) else 0
        if width == 0:
            return torch.full((len(idx), 0), PAD_ID, dtype=torch.long), torch.from_numpy(lens)
        starts = np.asarray(self.offsets[idx], dtype=np.int64)  # (B,)
        pos = np.arange(width)  # (L,)
        real = pos[None, :] < lens[:, None]  # (B, L)
        flat_idx = np.where(real, starts[:, None] + pos[None, :], 0)  # (B, L)
        ids = np.where(real, self.flat[flat_idx], PAD_ID).astype(np.int64)  # (B, L)
        self.release()
        return torch.from_numpy(ids), torch.from_numpy(lens)


class TokenDataset:
    """Pre-tokenized parallel data (ids without BOS/EOS), stored as flat arrays.

    Built from lists of ids (in memory), or with :meth:`from_arrays` over the arrays of a
    prepared cache (memory-mapped: nothing per sentence is held in memory). ``forced``: for
    a multilingual model with the tag on the target side, each sentence's first output token,
    forced when decoding (:mod:`nmt.data.multilingual`); None elsewhere.
    """

    forced: np.ndarray | None = None  # (N,) int64 token ids, or None

    def __init__(self, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]) -> None:
        if len(src) != len(tgt):
            raise DataError(f"TokenDataset: {len(src)} source vs {len(tgt)} target sentences")
        self._src = _Side.from_lists(src)
        self._tgt = _Side.from_lists(tgt)

    @classmethod
    def _from_sides(cls, src: _Side, tgt: _Side) -> TokenDataset:
        ds = cls.__new__(cls)
        ds._src, ds._tgt = src, tgt
        return ds

    @classmethod
    def from_arrays(
        cls,
        src: tuple[np.ndarray, np.ndarray, np.ndarray],
        tgt: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> TokenDataset:
        """A dataset over (flat ids, offsets, lengths) of each side, used as they are."""
        if len(src[2]) != len(tgt[2]):
            raise DataError(f"TokenDataset: {len(src[2])} source vs {len(tgt[2])} target sentences")
        return cls._from_sides(_Side(*src), _Side(*tgt))

    def __len__(self) -> int:
        return len(self._src.lens)

    @property
    def src_lens(self) -> np.ndarray:
        """(N,) integer source lengths (EOS not counted)."""
        return self._src.lens

    @property
    def tgt_lens(self) -> np.ndarray:
        """(N,) integer target lengths (BOS/EOS not counted)."""
        return self._tgt.lens

    def src(self, i: int) -> Tensor:
        """(L,) int32 source ids of sentence ``i``."""
        return self._src.item(i)

    def tgt(self, i: int) -> Tensor:
        """(L,) int32 target ids of sentence ``i``."""
        return self._tgt.item(i)

    def subset(self, indices: Sequence[int] | np.ndarray) -> TokenDataset:
        """A new dataset holding sentences ``indices`` (renumbered from 0), in memory."""
        idx = np.asarray(indices, dtype=np.int64)
        ds = TokenDataset._from_sides(self._src.subset(idx), self._tgt.subset(idx))
        if self.forced is not None:
            ds.forced = self.forced[idx]
        return ds


@dataclass
class Batch:
    """A padded batch. ``index`` holds the dataset indices of its rows."""

    src: Tensor  # (B, S) long, right-padded with PAD, each row ends with EOS
    src_lens: Tensor  # (B,) long, EOS counted
    # (B,) int64: the same lengths in host memory, for a model that needs them there (the GRU
    # packs its source with them); they stay on the host when the batch moves to a device
    src_lens_host: np.ndarray
    tgt_in: Tensor  # (B, T) long, BOS + target, PAD after
    tgt_out: Tensor  # (B, T) long, target + EOS, PAD after
    index: Tensor  # (B,) long
    n_tgt_tokens: int  # non-PAD positions in tgt_out
    # (N,) long, N = n_tgt_tokens: the non-PAD positions of tgt_out flattened row-major, so
    # the loss projects and scores only real tokens (built here, no device sync later)
    tgt_positions: Tensor

    def __len__(self) -> int:
        return self.src.size(0)

    def _map(self, fn: Callable[[Tensor], Tensor]) -> Batch:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return Batch(**{k: fn(v) if isinstance(v, Tensor) else v for k, v in values.items()})

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The batch on ``device``."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """The batch in page-locked host memory."""
        return self._map(Tensor.pin_memory)

    def to_device(self, device: torch.device) -> Batch:
        """The batch on ``device`` without making the host wait for the copy: to a GPU from
        page-locked memory, as a copy with ``non_blocking=True`` from pageable memory is not
        asynchronous. The training loop moves its batches with this."""
        batch = self.pin_memory() if device.type == "cuda" else self
        return batch.to(device, non_blocking=True)


def make_batch(ds: TokenDataset, indices: Sequence[int] | np.ndarray) -> Batch:
    """Pad sentences ``indices`` of ``ds`` into a :class:`Batch`."""
    idx = np.asarray(indices, dtype=np.int64)
    if idx.ndim != 1 or len(idx) == 0:
        raise ValueError("make_batch needs a non-empty 1-D list of indices")
    rows = torch.arange(len(idx))  # (B,)
    src_ids, src_len = ds._src.gather(idx)  # (B, Ls), (B,)
    src = torch.full((len(idx), src_ids.size(1) + 1), PAD_ID, dtype=torch.long)  # (B, S)
    src[:, :-1] = src_ids
    src[rows, src_len] = EOS_ID
    tgt_ids, tgt_len = ds._tgt.gather(idx)  # (B, Lt), (B,)
    width = tgt_ids.size(1) + 1
    tgt_in = torch.full((len(idx), width), PAD_ID, dtype=torch.long)  # (B, T)
    tgt_in[:, 0] = BOS_ID
    tgt_in[:, 1:] = tgt_ids
    tgt_out = torch.full((len(idx), width), PAD_ID, dtype=torch.long)  # (B, T)
    tgt_out[:, :-1] = tgt_ids
    tgt_out[rows, tgt_len] = EOS_ID
    positions = torch.nonzero(tgt_out.flatten() != PAD_ID).squeeze(1)  # (N,)
    return Batch(
        src=src,
        src_lens=src_len + 1,
        src_lens_host=src_len.numpy() + 1,
        tgt_in=tgt_in,
        tgt_out=tgt_out,
        index=torch.from_numpy(idx.copy()),
        n_tgt_tokens=int(tgt_len.sum()) + len(idx),
        tgt_positions=positions,
    )


def example_costs(src_lens: np.ndarray, tgt_lens: np.ndarray | None = None) -> np.ndarray:
    """(N,) positions one example takes in a batch: max(source + 1, target + 1).

    Integer lengths keep their width (at least 32 bits): int32 lengths of millions of
    examples cost 4 bytes each, and one array is allocated.
    """
    src = np.asarray(src_lens)
    if src.dtype.kind not in "iu":
        src = src.astype(np.int64)
    cost = src.astype(np.promote_types(src.dtype, np.int32))  # (N,) a new array
    if tgt_lens is not None:
        np.maximum(cost, tgt_lens, out=cost, casting="unsafe")
    cost += 1
    return cost


class BatchList(Sequence[list[int]]):
    """Batches of dataset indices held compactly: one index array and each batch's span.

    It reads like a list of lists of ints (a batch comes out as a list); slices and
    :meth:`take` keep the compact form. An epoch of millions of sentences costs 8 bytes per
    index instead of a Python int and a list slot each.
    """

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, order: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self.order = order  # (N,) integer dataset indices, batch after batch
        self.starts = starts  # (B,) int64: batch b is order[starts[b]:ends[b]]
        self.ends = ends  # (B,) int64

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, i: int) -> list[int]: ...

    @overload
    def __getitem__(self, i: slice) -> BatchList: ...

    def __getitem__(self, i: int | slice) -> list[int] | BatchList:
        if isinstance(i, slice):
            return BatchList(self.order, self.starts[i], self.ends[i])
        return self.order[self.starts[i] : self.ends[i]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        for a, b in zip(self.starts.tolist(), self.ends.tolist(), strict=True):
            yield self.order[a:b].tolist()

    def take(self, picks: np.ndarray) -> BatchList:
        """The batches ``picks``, in that order."""
        return BatchList(self.order, self.starts[picks], self.ends[picks])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (BatchList, list, tuple)):
            return NotImplemented
        return len(self) == len(other) and all(
            list(a) == list(b) for a, b in zip(self, other, strict=True)
        )

    def __repr__(self) -> str:
        return f"BatchList({len(self)} batches, {int((self.ends - self.starts).sum())} indices)"


def cut_batches(order: np.ndarray, cost: np.ndarray, max_tokens: int) -> BatchList:
    """Greedily cut ``order`` into consecutive batches of cost ``n * max(cost) <= max_tokens``.

    An example that alone exceeds the budget gets a batch of its own. Each batch is found
    with a few array operations over a window of at most ``max_tokens // cost + 1`` examples
    (no batch can hold more), so cutting millions of examples takes a fraction of a second.
    """
    order = np.asarray(order)  # (N,) integer indices, kept in their width
    if order.dtype.kind not in "iu":
        order = order.astype(np.int64)
    c = np.asarray(cost)[order]  # (N,) costs in batch order
    n = len(order)
    starts: list[int] = []
    p = 0
    while p < n:
        width = min(n - p, max_tokens // max(int(c[p]), 1) + 1)
        grown = np.maximum.accumulate(c[p : p + width]) * np.arange(1, width + 1)  # (width,)
        over = grown > max_tokens
        over[0] = False  # the first example always starts a batch
        starts.append(p)
        p += int(np.argmax(over)) if over.any() else width
    first = np.asarray(starts, dtype=np.int64)  # (B,)
    last = np.append(first[1:], n).astype(np.int64) if n else first  # (B,)
    return BatchList(order, first, last)


def length_order(
    src_lens: np.ndarray, tgt_lens: np.ndarray, rng: np.random.Generator | None = None
) -> np.ndarray:
    """Indices sorted by source length, then target length, then a random (or index) tie-break."""
    n = len(src_lens)
    tie = rng.permutation(n) if rng is not None else np.arange(n)
    if n == 0:
        return tie
    src, tgt = np.asarray(src_lens), np.asarray(tgt_lens)  # (N,) integer, not copied
    width = int(tgt.max()) + 1
    if min(int(src.min()), int(tgt.min())) >= 0 and (int(src.max()) + 1) * width * n < 2**62:
        # one int64 key, unique thanks to the tie-break: the lexsort's order, four times
        # faster; built in place, so millions of lengths need one temporary array
        key = src.astype(np.int64)  # (N,)
        key *= width
        key += tgt
        key *= n
        key += tie
        return np.argsort(key)
    return np.lexsort((tie, tgt, src))


def eval_batches(
    src_lens: np.ndarray, max_tokens: int, tgt_lens: np.ndarray | None = None
) -> BatchList:
    """Batches for decoding: longest sources first (so memory limits show up at once).

    Cost counts the source side (and the target side if ``tgt_lens`` is given). Nothing is
    dropped: a sentence over the budget is batched alone.
    """
    src_lens = np.asarray(src_lens, dtype=np.int64)
    order = np.argsort(-src_lens, kind="stable")
    return cut_batches(order, example_costs(src_lens, tgt_lens), max_tokens)


def _lengths(values: Sequence[int] | np.ndarray) -> np.ndarray:
    """Lengths as an integer array, kept in their dtype (a memory-mapped int32 stays one)."""
    arr = np.asarray(values)
    return arr if arr.dtype.kind in "iu" else np.asarray(values, dtype=np.int64)


class TokenBatchSampler:
    """Length-bucketed batches under a token budget, shuffled per epoch, split across ranks.

    ``batches(epoch)`` is a pure function of (seed, epoch, lengths, max_tokens, replicas, rank,
    corpora): a resumed run rebuilds the epoch and skips the batches it has already consumed.

    ``corpora``: (pairs, weight) of consecutive index ranges (the training corpora in order).
    Where a weight is not 1, each epoch takes ``round(weight * pairs)`` examples of that
    corpus: every example ``floor`` times, plus a random subset drawn from (seed, epoch,
    corpus). With all weights 1 the epoch is every example once, as without ``corpora``.
    """

    def __init__(
        self,
        src_lens: Sequence[int] | np.ndarray,
        tgt_lens: Sequence[int] | np.ndarray,
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        corpora: Sequence[tuple[int, float]] | None = None,
    ) -> None:
        self.src_lens = _lengths(src_lens)  # (N,)
        self.tgt_lens = _lengths(tgt_lens)  # (N,)
        if self.src_lens.shape != self.tgt_lens.shape:
            raise ValueError("src_lens and tgt_lens differ in length")
        if max_tokens <= 0 or num_replicas <= 0 or not 0 <= rank < num_replicas:
            raise ValueError(
                f"bad max_tokens={max_tokens}, num_replicas={num_replicas}, rank={rank}"
            )
        self.corpora = [(int(n), float(w)) for n, w in corpora] if corpora else None
        if self.corpora is not None:
            if sum(n for n, _ in self.corpora) != len(self.src_lens):
                raise ValueError("the corpora's sizes do not add up to the number of examples")
            if any(n <= 0 or not w > 0 for n, w in self.corpora):
                raise ValueError(f"every corpus needs pairs and a weight > 0: {self.corpora}")
        self._weighted = self.corpora is not None and any(w != 1 for _, w in self.corpora)
        self.max_tokens = int(max_tokens)
        self.shuffle, self.seed = shuffle, int(seed)
        self.num_replicas, self.rank = num_replicas, rank
        self._memo: tuple[int, BatchList] | None = None
        self._cost = example_costs(self.src_lens, self.tgt_lens)  # (N,)
        self._check_budget()

    def with_lengths(
        self, src_lens: Sequence[int] | np.ndarray, tgt_lens: Sequence[int] | np.ndarray
    ) -> TokenBatchSampler:
        """The same sampler (seed, budget, ranks, corpora) over new lengths of the same
        examples: an epoch of resegmented pairs (:mod:`nmt.data.resegment`)."""
        if len(src_lens) != len(self.src_lens):
            raise ValueError(f"{len(src_lens)} examples, the sampler has {len(self.src_lens)}")
        return TokenBatchSampler(
            src_lens, tgt_lens, self.max_tokens, self.shuffle, self.seed,
            self.num_replicas, self.rank, self.corpora,
        )  # fmt: skip

    def _check_budget(self) -> None:
        too_long = np.flatnonzero(self._cost > self.max_tokens)
        if len(too_long):
            i = int(too_long[0])
            raise DataError(
                f"example {i} (source {self.src_lens[i]} tokens, target {self.tgt_lens[i]} "
                f"tokens, +1 for EOS/BOS) does not fit in max_tokens={self.max_tokens}; "
                f"{len(too_long)} example(s) too long: raise data.max_tokens or lower data.max_len"
            )

    def epoch_examples(self, epoch: int) -> np.ndarray | None:
        """The dataset indices making up ``epoch`` under the corpus weights (None: all once)."""
        if not self._weighted:
            return None
        assert self.corpora is not None
        parts = []
        start = 0
        for k, (n, weight) in enumerate(self.corpora):
            full, rest = divmod(max(1, round(weight * n)), n)
            parts += [np.arange(start, start + n, dtype=np.int64)] * full
            if rest:
                rng = np.random.default_rng([self.seed, epoch, k, 1])
                parts.append(start + np.sort(rng.choice(n, size=rest, replace=False)))
            start += n
        return np.concatenate(parts)

    def global_batches(self, epoch: int) -> BatchList:
        """All ranks' batches of ``epoch``, in the order they are dealt out."""
        rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
        examples = self.epoch_examples(epoch)
        if examples is None:
            order = length_order(self.src_lens, self.tgt_lens, rng)
        else:
            local = length_order(self.src_lens[examples], self.tgt_lens[examples], rng)
            order = examples[local]
        if len(order) < 2**31:
            order = order.astype(np.int32)  # half the memory of the epoch's order
        batches = cut_batches(order, self._cost, self.max_tokens)
        if rng is not None:
            batches = batches.take(rng.permutation(len(batches)))
        return batches

    def batches(self, epoch: int) -> BatchList:
        """This rank's batches of ``epoch``: every ``num_replicas``-th batch, equal counts."""
        if self._memo is not None and self._memo[0] == epoch:
            return self._memo[1]
        batches = self.global_batches(epoch)
        per_rank = len(batches) // self.num_replicas
        mine = batches[self.rank :: self.num_replicas][:per_rank]
        self._memo = (epoch, mine)
        return mine


def padding_share(ds: TokenDataset, batches: Sequence[Sequence[int]]) -> float:
    """Fraction of PAD among all source and target positions of ``batches``."""
    if isinstance(batches, BatchList):
        return _padding_share_compact(ds, batches)
    total = real = 0
    for batch in batches:
        idx = np.asarray(batch, dtype=np.int64)
        s, t = ds.src_lens[idx] + 1, ds.tgt_lens[idx] + 1  # (B,) with EOS / BOS
        total += len(idx) * (int(s.max()) + int(t.max()))
        real += int(s.sum()) + int(t.sum())
    return 1.0 - real / total if total else 0.0


def _padding_share_compact(ds: TokenDataset, batches: BatchList, step: int = 256) -> float:
    """:func:`padding_share` of a BatchList with array operations, ``step`` batches at a time."""
    total = real = 0
    for k in range(0, len(batches), step):
        starts, ends = batches.starts[k : k + step], batches.ends[k : k + step]  # (B,)
        sizes = ends - starts  # (B,) every batch holds at least one example
        first = np.zeros(len(sizes), dtype=np.int64)  # (B,) where each batch begins in `rows`
        np.cumsum(sizes[:-1], out=first[1:])
        pos = np.arange(int(sizes.sum())) + np.repeat(starts - first, sizes)  # (M,) into order
        rows = batches.order[pos]  # (M,) dataset indices, batch after batch
        for lens in (ds.src_lens, ds.tgt_lens):
            width = np.asarray(lens[rows], dtype=np.int64) + 1  # (M,) with EOS / BOS
            total += int((sizes * np.maximum.reduceat(width, first)).sum())
            real += int(width.sum())
    return 1.0 - real / total if total else 0.0

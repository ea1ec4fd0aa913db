"""Token-id datasets held as flat tensors, padded batches, and token-budget batch samplers.

The cost of a batch is ``n_sentences * max(longest source + 1, longest target + 1)``: the
number of positions of its larger padded side (source + EOS, or BOS/EOS + target).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from nmt.data.corpus import DataError
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


class _Side:
    """One side of a corpus: all ids in one flat int32 tensor plus per-sentence offsets."""

    def __init__(self, flat: Tensor, offsets: np.ndarray) -> None:
        self.flat = flat  # (total_tokens,) int32
        self.offsets = offsets  # (N + 1,) int64; sentence i is flat[offsets[i]:offsets[i + 1]]
        self.lens = np.diff(offsets)  # (N,) int64

    @classmethod
    def from_lists(cls, seqs: Sequence[Sequence[int]]) -> _Side:
        lens = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))  # (N,)
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)  # (N + 1,)
        np.cumsum(lens, out=offsets[1:])
        flat = np.fromiter(
            itertools.chain.from_iterable(seqs), dtype=np.int32, count=int(offsets[-1])
        )  # (total_tokens,)
        return cls(torch.from_numpy(flat), offsets)

    def item(self, i: int) -> Tensor:
        return self.flat[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def subset(self, idx: np.ndarray) -> _Side:
        lens = self.lens[idx]  # (M,)
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)  # (M + 1,)
        np.cumsum(lens, out=offsets[1:])
        # position k of new sentence j comes from flat[old_start[j] + k]
        shift = np.repeat(self.offsets[idx] - offsets[:-1], lens)  # (total,)
        positions = np.arange(int(offsets[-1]), dtype=np.int64) + shift  # (total,)
        return _Side(self.flat[torch.from_numpy(positions)], offsets)

    def gather(self, idx: np.ndarray) -> tuple[Tensor, Tensor]:
        """Sentences ``idx`` as (B, L) int64 right-padded with PAD, and their (B,) lengths."""
        lens = torch.from_numpy(self.lens[idx])  # (B,)
        width = int(lens.max()) if len(idx) else 0
        if width == 0:
            return torch.full((len(idx), 0), PAD_ID, dtype=torch.long), lens
        starts = torch.from_numpy(self.offsets[idx])  # (B,)
        pos = torch.arange(width)  # (L,)
        real = pos[None, :] < lens[:, None]  # (B, L)
        flat_idx = (starts[:, None] + pos[None, :]).masked_fill(~real, 0)  # (B, L)
        ids = self.flat[flat_idx].long().masked_fill(~real, PAD_ID)  # (B, L)
        return ids, lens


class TokenDataset:
    """Pre-tokenized parallel data (ids without BOS/EOS), stored as flat int32 tensors."""

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

    def __len__(self) -> int:
        return len(self._src.lens)

    @property
    def src_lens(self) -> np.ndarray:
        """(N,) int64 source lengths (EOS not counted)."""
        return self._src.lens

    @property
    def tgt_lens(self) -> np.ndarray:
        """(N,) int64 target lengths (BOS/EOS not counted)."""
        return self._tgt.lens

    def src(self, i: int) -> Tensor:
        """(L,) int32 source ids of sentence ``i``."""
        return self._src.item(i)

    def tgt(self, i: int) -> Tensor:
        """(L,) int32 target ids of sentence ``i``."""
        return self._tgt.item(i)

    def subset(self, indices: Sequence[int] | np.ndarray) -> TokenDataset:
        """A new dataset holding sentences ``indices`` (renumbered from 0)."""
        idx = np.asarray(indices, dtype=np.int64)
        return TokenDataset._from_sides(self._src.subset(idx), self._tgt.subset(idx))


@dataclass
class Batch:
    """A padded batch. ``index`` holds the dataset indices of its rows."""

    src: Tensor  # (B, S) long, right-padded with PAD, each row ends with EOS
    src_lens: Tensor  # (B,) long, EOS counted
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
        """The batch in page-locked memory (for asynchronous host-to-GPU copies)."""
        return self._map(lambda t: t.pin_memory())


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
        tgt_in=tgt_in,
        tgt_out=tgt_out,
        index=torch.from_numpy(idx.copy()),
        n_tgt_tokens=int(tgt_len.sum()) + len(idx),
        tgt_positions=positions,
    )


def example_costs(src_lens: np.ndarray, tgt_lens: np.ndarray | None = None) -> np.ndarray:
    """(N,) positions one example takes in a batch: max(source + 1, target + 1)."""
    cost = np.asarray(src_lens, dtype=np.int64) + 1
    if tgt_lens is not None:
        cost = np.maximum(cost, np.asarray(tgt_lens, dtype=np.int64) + 1)
    return cost


def cut_batches(order: np.ndarray, cost: np.ndarray, max_tokens: int) -> list[list[int]]:
    """Greedily cut ``order`` into consecutive batches of cost ``n * max(cost) <= max_tokens``.

    An example that alone exceeds the budget gets a batch of its own.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    widest = 0
    cost_list = cost.tolist()
    for i in order.tolist():
        c = cost_list[i]
        w = max(widest, c)
        if current and (len(current) + 1) * w > max_tokens:
            batches.append(current)
            current, w = [], c
        current.append(i)
        widest = w
    if current:
        batches.append(current)
    return batches


def length_order(
    src_lens: np.ndarray, tgt_lens: np.ndarray, rng: np.random.Generator | None = None
) -> np.ndarray:
    """Indices sorted by source length, then target length, then a random (or index) tie-break."""
    n = len(src_lens)
    tie = rng.permutation(n) if rng is not None else np.arange(n)
    return np.lexsort((tie, tgt_lens, src_lens))


def eval_batches(
    src_lens: np.ndarray, max_tokens: int, tgt_lens: np.ndarray | None = None
) -> list[list[int]]:
    """Batches for decoding: longest sources first (so memory limits show up at once).

    Cost counts the source side (and the target side if ``tgt_lens`` is given). Nothing is
    dropped: a sentence over the budget is batched alone.
    """
    src_lens = np.asarray(src_lens, dtype=np.int64)
    order = np.argsort(-src_lens, kind="stable")
    return cut_batches(order, example_costs(src_lens, tgt_lens), max_tokens)


class TokenBatchSampler:
    """Length-bucketed batches under a token budget, shuffled per epoch, split across ranks.

    ``batches(epoch)`` is a pure function of (seed, epoch, lengths, max_tokens, replicas, rank):
    a resumed run rebuilds the epoch and skips the batches it has already consumed.
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
    ) -> None:
        self.src_lens = np.asarray(src_lens, dtype=np.int64)  # (N,)
        self.tgt_lens = np.asarray(tgt_lens, dtype=np.int64)  # (N,)
        if self.src_lens.shape != self.tgt_lens.shape:
            raise ValueError("src_lens and tgt_lens differ in length")
        if max_tokens <= 0 or num_replicas <= 0 or not 0 <= rank < num_replicas:
            raise ValueError(
                f"bad max_tokens={max_tokens}, num_replicas={num_replicas}, rank={rank}"
            )
        self.max_tokens = int(max_tokens)
        self.shuffle, self.seed = shuffle, int(seed)
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0
        self._len: int | None = None
        self._cost = example_costs(self.src_lens, self.tgt_lens)  # (N,)
        self._check_budget()

    def _check_budget(self) -> None:
        too_long = np.flatnonzero(self._cost > self.max_tokens)
        if len(too_long):
            i = int(too_long[0])
            raise DataError(
                f"example {i} (source {self.src_lens[i]} tokens, target {self.tgt_lens[i]} "
                f"tokens, +1 for EOS/BOS) does not fit in max_tokens={self.max_tokens}; "
                f"{len(too_long)} example(s) too long: raise data.max_tokens or lower data.max_len"
            )

    def global_batches(self, epoch: int) -> list[list[int]]:
        """All ranks' batches of ``epoch``, in the order they are dealt out."""
        rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
        order = length_order(self.src_lens, self.tgt_lens, rng)
        batches = cut_batches(order, self._cost, self.max_tokens)
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch``: every ``num_replicas``-th batch, equal counts."""
        batches = self.global_batches(epoch)
        per_rank = len(batches) // self.num_replicas
        return batches[self.rank :: self.num_replicas][:per_rank]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches(self.epoch))

    def __len__(self) -> int:
        # the batch boundaries depend only on the sorted lengths, so every epoch has this count
        if self._len is None:
            self._len = len(self.batches(self.epoch))
        return self._len


def padding_share(ds: TokenDataset, batches: Sequence[Sequence[int]]) -> float:
    """Fraction of PAD among all source and target positions of ``batches``."""
    total = real = 0
    for batch in batches:
        idx = np.asarray(batch, dtype=np.int64)
        s, t = ds.src_lens[idx] + 1, ds.tgt_lens[idx] + 1  # (B,) with EOS / BOS
        total += len(idx) * (int(s.max()) + int(t.max()))
        real += int(s.sum()) + int(t.sum())
    return 1.0 - real / total if total else 0.0

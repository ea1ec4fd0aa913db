"""Decoding with CTranslate2 (``engine=ctranslate2``): a converted package's model behind the
search options of :class:`~nmt.decode.options.DecodeOptions` (the converter:
:mod:`nmt.ship.ctranslate2`).

Decoding options map as follows (:class:`CTranslate2Engine`):

* ``beam`` -> ``beam_size``; ``min_output_len`` -> ``min_decoding_length``;
* the output cap (:meth:`~nmt.decode.options.DecodeOptions.caps`, the same as our search's) is
  per sentence here and per call in CTranslate2 (``max_decoding_length``). One call decodes
  sentences of several caps with the largest of them (on CPU, calls of about ``CALL_ROWS``
  hypotheses, of sentences sorted by cap: larger calls decode slower), and a sentence keeps that
  result only where it provably equals the one its own cap gives; the others are decoded again,
  those of each cap together (:meth:`CTranslate2Engine.decode_ids`). Greedy search: the output
  stopped before its own cap. Beam search with alpha > 0: CTranslate2 ends a sentence at the
  step where its pool of finished hypotheses reaches ``beam * patience``, and up to that step a
  larger cap changes nothing; we ask for the whole pool (``num_hypotheses = beam * patience``),
  whose longest hypothesis was finished at that last step, and keep the result when that
  hypothesis is shorter than the own cap (with EOS counted), i.e. the search ended before the
  own cap could act. The ``beam`` best of that pool, in CTranslate2's order, are exactly what a
  call asking for ``beam`` hypotheses returns. With alpha = 0 CTranslate2 stops once the top
  beam has finished and ``num_hypotheses`` hypotheses have, so asking for the pool would change
  the stop: the sentences of each cap are decoded together. At the cap our search closes a
  hypothesis with EOS and adds that EOS's log-probability to its score; CTranslate2
  stops without it, so scores of capped outputs differ by that term (tokens do not);
* ``length_penalty``: CTranslate2 divides by ``length ** alpha``, we by the GNMT
  ``((5 + length) / 6) ** alpha``; no alpha maps one onto the other. CTranslate2's beam stops
  once ``beam * patience`` hypotheses have finished and returns the best ``beam`` of them under
  its penalty; we ask for those with their scores (``return_end_token``, so that the length
  counts EOS as ours does), undo its penalty and rank them with ours, so the scores and their
  order are exactly ours. What can differ is the pool: our search goes on while an alive
  hypothesis could still beat the best finished one. With patience 1 CTranslate2 missed our
  output on 10 of 120 sentences of a small trained model, with patience 2 (``BEAM_PATIENCE``,
  used whenever alpha > 0) on none. With ``length_penalty=0`` both return the hypothesis with
  the best summed log-probability, and CTranslate2 stops as exactly as ours (patience 1).
* attention (``keep_attention``): CTranslate2's beam search returns the right weights only for
  a batch of one sentence, so beam search with attention makes one call per sentence (greedy
  search's are right in any batch);
* threads: on CPU, ``threads`` workers of one thread each (``inter_threads``) decode calls side
  by side, and a decode's calls are queued for them together;
* a multilingual model's target tag (:mod:`nmt.decode.languages`): at source placement it is
  the source's first piece; at target placement the forced first token (``TokenDataset.forced``,
  ``forced=`` of :meth:`CTranslate2Engine.decode_ids`) is CTranslate2's ``target_prefix``, with
  one more token in the cap as in our search; it stays in the output's tokens, as in ours;
* sources longer than the position table are cut as ours are
  (:func:`~nmt.decode.search.clip_sources`); ``max_tokens`` becomes ``max_batch_size`` with
  ``batch_type="tokens"`` (source tokens only); ``precision`` has no equivalent: the weight
  type is the package's (``--quantize``).
"""

from __future__ import annotations

import logging
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nmt.cli import Advance, no_progress, usable_cores
from nmt.config import ConfigError
from nmt.data.tokenizer import BOS_ID, EOS_ID, TokenizerPair
from nmt.decode.options import DecodeOptions
from nmt.environment import mkl_threads_unset

if TYPE_CHECKING:  # decoding needs no PyTorch
    from nmt.data.batching import TokenDataset

log = logging.getLogger(__name__)

# CTranslate2's beam stops at beam * patience finished hypotheses: 2 gave our outputs on every
# sentence of a small trained model where 1 missed 10 of 120 (BLEU 91.7 instead of 95.2)
BEAM_PATIENCE = 2.0
# sentences * beam of one call on CPU: on 1,000 test sentences of a trained cpu_quick model, one
# call of all (split by max_tokens=8192) ran beam 5 at 0.7x and greedy at 0.8x the speed of
# calls of 32 (beam 5) or 64-160 (greedy) sentences of similar length
CALL_ROWS = 160
VERSION = "4.8.5"  # the CTranslate2 release the converter was written and tested against
MISSING_EXTRA = (
    "CTranslate2 is not installed: it comes with the optional extra, "
    "pip install 'nmt[export]' (ctranslate2=={version})"
)


def require() -> Any:
    """The ``ctranslate2`` module, or a ConfigError saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise ConfigError(MISSING_EXTRA.format(version=VERSION)) from None
    return ctranslate2


def available() -> bool:
    try:
        require()
    except ConfigError:
        return False
    return True


def version() -> str:
    return str(require().__version__)


def ct2_device(device: Any) -> tuple[str, int]:
    """CTranslate2's ``(device, device_index)`` for nmt's device: a ``torch.device`` or a name
    (``auto | cpu | cuda | cuda:N``, the ``device`` of the commands). ``auto`` is the first GPU
    when CTranslate2 sees one (its own CUDA build and driver decide, not PyTorch's), else the
    CPU; ``cuda:N`` is GPU N. A ConfigError names a GPU CTranslate2 cannot see."""
    name = str(device)
    if name == "auto":
        return ("cuda", 0) if require().get_cuda_device_count() > 0 else ("cpu", 0)
    kind, colon, number = name.partition(":")
    if kind == "cpu" and not colon:
        return "cpu", 0
    if kind != "cuda" or (colon and not number.isdigit()):
        raise ConfigError(f"device={name!r} is not a device: auto | cpu | cuda | cuda:N")
    index = int(number) if colon else 0
    count = require().get_cuda_device_count()
    if index >= count:
        raise ConfigError(
            f"device={name!r}, but CTranslate2 sees {count} CUDA device(s) (a CPU-only "
            "CTranslate2 build sees none)"
        )
    return "cuda", index


# ------------------------------------------------------------------------------------ decode


def vocabulary(tokenizers: TokenizerPair, side: str) -> list[str]:
    """The pieces of a tokenizer in id order: CTranslate2's ids are then ours."""
    tok = tokenizers.src if side == "src" else tokenizers.tgt
    return tok.pieces(range(tok.vocab_size))


@dataclass
class Decoded:
    """One sentence's output, shaped like :class:`nmt.decode.search.Hypothesis` (without
    PyTorch)."""

    tokens: list[int]  # without BOS and EOS
    score: float = 0.0
    attention: np.ndarray | None = None  # (len(tokens) + 1, S), the EOS step included
    nbest: list[tuple[list[int], float]] = field(default_factory=list)  # best first


def pool_size(opts: DecodeOptions) -> int:
    """``num_hypotheses`` asked of CTranslate2: with beam search and alpha > 0 its whole pool
    of finished hypotheses (``beam * patience``, rounded as CTranslate2 does), else ``beam``
    (with alpha = 0 the count is part of CTranslate2's stopping rule)."""
    if opts.beam > 1 and opts.length_penalty != 0:
        return int(math.floor(opts.beam * BEAM_PATIENCE + 0.5))
    return opts.beam


def ended_before_cap(result: Any, opts: DecodeOptions, cap: int) -> bool:
    """Whether a CTranslate2 result decoded with a larger cap is the one ``cap`` gives.

    Both calls run alike until the last step of the smaller cap (step ``cap - 1``, where
    CTranslate2 closes every hypothesis). A hypothesis is finished at the step of its last
    piece (EOS counted), and the search ends at a step where one is; beam search ends when its
    pool first holds :func:`pool_size` hypotheses, so fewer than that came before the last
    step and one of that step is among the best :func:`pool_size` returned: the longest
    returned hypothesis gives the last step. Greedy search picks
    the same token at the last step whichever the cap, so ending there is still the same;
    beam search closes its other hypotheses there, so it must have ended a step earlier.
    """
    longest = max(len(pieces) for pieces in result.hypotheses)  # = the last step + 1
    return longest <= cap if opts.beam == 1 else longest < cap


def gnmt_penalty(length: int, alpha: float) -> float:
    """:func:`nmt.decode.search.length_penalty` of one length (EOS counted)."""
    return 1.0 if alpha == 0 else float(((5.0 + length) / 6.0) ** alpha)


class CTranslate2Engine:
    """Decoding with a package's CTranslate2 model (see the module docstring for the mapping)."""

    name = "ctranslate2"

    def __init__(
        self,
        model_dir: Path,
        tokenizers: TokenizerPair,
        max_positions: int | None,
        device: Any = "cpu",
        threads: int = 0,
        suppress_start: bool = False,
    ) -> None:
        ct2 = require()
        device_type, index = ct2_device(device)
        cuda = device_type == "cuda"
        # On CPU, `threads` workers of one thread each decode whole calls side by side, sharing
        # the weights (inter_threads), rather than one worker splitting each operation over
        # `threads` OpenMP threads (intra_threads). On a 2-core CPU, cpu_quick's 1,000 test
        # sentences decoded at 676 sentences/s greedy and 205 beam 5 with two workers, at 162
        # and 66 with one worker of two threads, at 293 and 86 with one worker of one thread.
        self.workers = 1 if cuda else max(1, threads or usable_cores())
        # CTranslate2 sets the calling thread's OpenMP thread count, which a PyTorch loaded in
        # the same process shares: it is put back (else our search runs on one thread)
        torch = sys.modules.get("torch")
        torch_threads = torch.get_num_threads() if torch is not None else 0
        self.src_pieces = vocabulary(tokenizers, "src")
        # CTranslate2's MKL reads MKL_NUM_THREADS at its first matrix product. Set, to any value,
        # the one-thread workers no longer run side by side: 27-35 ms a sentence against 11-14
        # unset (beam 5, batches of one, two workers, cpu_quick's model). So the translator is
        # built and makes one product without it; the workers set their own thread counts.
        with mkl_threads_unset(not cuda):
            self.translator = ct2.Translator(
                str(model_dir),
                device=device_type,
                device_index=index,
                intra_threads=threads if cuda else 1,
                inter_threads=self.workers,
            )
            if not cuda:  # the first product reads the environment
                self.translator.translate_batch([[self.src_pieces[EOS_ID]]], max_decoding_length=1)
        if torch is not None:
            torch.set_num_threads(torch_threads)
        tgt = vocabulary(tokenizers, "tgt")
        self.tgt_pieces = tgt
        self.tgt_ids = {piece: i for i, piece in enumerate(tgt)}
        self.eos_piece = tgt[EOS_ID]
        # a model whose BOS is never an output (model.suppress_start; before the softmax here)
        self.suppressed = [[tgt[BOS_ID]]] if suppress_start else None
        self.max_positions = max_positions
        self.calls = 0  # translate_batch calls submitted, for tests and benchmarks
        self.redone = 0  # sentences decoded again with their own cap
        # on CPU, calls of about CALL_ROWS hypotheses decode faster than larger ones
        self.call_rows = CALL_ROWS if not cuda else 0

    def _source(self, ids: list[int]) -> list[str]:
        """Source pieces with EOS appended, cut to the position table as ours are."""
        ids = list(ids) + [EOS_ID]
        if self.max_positions is not None and len(ids) > self.max_positions:
            ids = ids[: self.max_positions - 1] + [EOS_ID]
        return [self.src_pieces[t] for t in ids]

    def _ids(self, pieces: list[str]) -> list[int]:
        """Token ids of an output, without its EOS."""
        ended = bool(pieces) and pieces[-1] == self.eos_piece
        return [self.tgt_ids[p] for p in (pieces[:-1] if ended else pieces)]

    def _submit(
        self,
        sources: list[list[str]],
        opts: DecodeOptions,
        cap: int,
        keep_attention: bool,
        prefixes: list[list[str]] | None = None,
    ) -> list[Any]:
        """One call, queued for the workers: an asynchronous result per source (``prefixes``:
        each output's first pieces, a multilingual model's target tag)."""
        greedy = opts.beam == 1
        self.calls += 1
        return self.translator.translate_batch(
            sources,
            target_prefix=prefixes,
            max_batch_size=opts.max_tokens,
            batch_type="tokens",
            beam_size=opts.beam,
            num_hypotheses=pool_size(opts),
            # greedy: raw summed log-probabilities; beam: CTranslate2's length ** alpha,
            # undone and replaced by ours in _decoded (alpha = 0 keeps its exact stop)
            length_penalty=0.0 if greedy else opts.length_penalty,
            patience=1.0 if greedy or opts.length_penalty == 0 else BEAM_PATIENCE,
            return_end_token=True,
            suppress_sequences=self.suppressed,
            max_input_length=0,
            max_decoding_length=cap,
            min_decoding_length=min(opts.min_output_len, cap),
            return_scores=True,
            return_attention=keep_attention,
            asynchronous=True,
        )

    def _decoded(self, result: Any, opts: DecodeOptions, src_len: int, keep: bool) -> Decoded:
        alpha = opts.length_penalty if opts.beam > 1 else 0.0
        nbest = []
        # the best beam of the pool in CTranslate2's order: what num_hypotheses=beam returns
        for k, pieces in enumerate(result.hypotheses[: opts.beam]):
            score = float(result.scores[k])
            if alpha != 0:
                raw = score * max(len(pieces), 1) ** alpha  # CTranslate2 divided by this
                score = raw / gnmt_penalty(len(pieces), alpha)
            nbest.append((self._ids(pieces), score, k))
        nbest.sort(key=lambda x: -x[1])
        attention = None
        if keep and result.attention:
            rows = np.asarray(result.attention[nbest[0][2]], dtype=np.float32)
            attention = rows[: len(nbest[0][0]) + 1, :src_len]
        return Decoded(nbest[0][0], nbest[0][1], attention, [(t, s) for t, s, _ in nbest])

    def decode_ids(
        self,
        sources: list[list[int]],
        opts: DecodeOptions,
        keep_attention: bool = False,
        per_cap: bool = False,
        spread: bool = True,
        advance: Advance = no_progress,
        forced: Sequence[int] | None = None,
    ) -> list[Decoded]:
        """Outputs for source token ids (without EOS), in order; an empty source gives an
        empty output (score 0) without being decoded. ``forced``: each sentence's first output
        token (a negative id: none), given to CTranslate2 as its ``target_prefix`` and, as in
        our search, one more token in its cap; it stays in the output's tokens as in ours.

        The sentences, sorted by cap, are decoded in calls of ``call_rows // beam`` (on CPU;
        all in one on CUDA), each with the largest cap among its sentences; a sentence whose
        search did not provably end before its own cap could act (:func:`ended_before_cap`) is
        decoded again with its own cap, together with the others of that cap. ``per_cap``
        decodes every sentence with its own cap (one call per cap): the reference the shared
        calls equal. Beam search with attention decodes each sentence in a call of its own. On
        CPU the calls are queued for the workers together, and with ``spread`` each worker gets
        one (without, a caller that runs several decodes at once keeps the calls larger).
        ``advance`` is called with the sentences done, a call at a time.
        """
        out: list[Decoded | None] = [None] * len(sources)
        rows = [i for i, ids in enumerate(sources) if len(ids) > 0]
        for i, ids in enumerate(sources):
            if len(ids) == 0:
                out[i] = Decoded([], 0.0, None, [([], 0.0)])
        advance(len(sources) - len(rows))
        pieces = [self._source(sources[i]) for i in rows]
        lens = np.asarray([len(p) for p in pieces], dtype=np.int64)
        caps_list = opts.caps(lens, self.max_positions).tolist()  # as our search's caps
        first = [-1 if forced is None else int(forced[i]) for i in rows]
        prefix = [[self.tgt_pieces[t]] if t >= 0 else [] for t in first]
        caps_list = [c + (t >= 0) for c, t in zip(caps_list, first, strict=True)]

        def prefixes(members: list[int]) -> list[list[str]] | None:
            return [prefix[j] for j in members] if any(t >= 0 for t in first) else None

        groups: dict[int, list[int]] = defaultdict(list)  # cap -> positions in rows
        # CTranslate2's beam search gives a sentence's attention right only in a batch of one
        # (in a larger one it can be another sentence's): one call each
        alone = keep_attention and opts.beam > 1
        shared = rows and not per_cap and not alone and (opts.beam == 1 or opts.length_penalty != 0)
        if shared:  # one call up to the largest cap; the results it cannot vouch for redone
            order = sorted(range(len(rows)), key=lambda j: caps_list[j])
            size = max(1, self.call_rows // opts.beam) if self.call_rows else len(order)
            if spread:  # every worker gets a call
                size = min(size, math.ceil(len(order) / self.workers))
            chunks = [order[start : start + size] for start in range(0, len(order), size)]
            calls = [
                self._submit(
                    [pieces[j] for j in chunk],
                    opts,
                    caps_list[chunk[-1]],
                    keep_attention,
                    prefixes(chunk),
                )
                for chunk in chunks
            ]
            for chunk, pending in zip(chunks, calls, strict=True):
                top, done = caps_list[chunk[-1]], 0
                for j, waiting in zip(chunk, pending, strict=True):
                    result = waiting.result()
                    if caps_list[j] == top or ended_before_cap(result, opts, caps_list[j]):
                        out[rows[j]] = self._decoded(result, opts, int(lens[j]), keep_attention)
                        done += 1
                    else:
                        groups[caps_list[j]].append(j)
                advance(done)
            self.redone += sum(len(members) for members in groups.values())
        elif rows:
            for j, cap in enumerate(caps_list):
                groups[cap].append(j)
        batches = list(groups.values())
        if alone:  # one sentence per call, each with its own cap
            batches = [[j] for members in batches for j in members]
        calls = [
            self._submit(
                [pieces[j] for j in members],
                opts,
                caps_list[members[0]],
                keep_attention,
                prefixes(members),
            )
            for members in batches
        ]
        for members, pending in zip(batches, calls, strict=True):
            for j, waiting in zip(members, pending, strict=True):
                out[rows[j]] = self._decoded(waiting.result(), opts, int(lens[j]), keep_attention)
            advance(len(members))
        return [d for d in out if d is not None]

    def hypotheses(
        self,
        data: TokenDataset,
        opts: DecodeOptions,
        limit: int = 0,
        keep_attention: bool = False,
        advance: Advance = no_progress,
    ) -> list[Decoded]:
        """Outputs for (the first ``limit`` sentences of) ``data``, in order (``advance``:
        called with the sentences done)."""
        n = len(data) if limit <= 0 else min(limit, len(data))
        sources = [data.src(i).tolist() for i in range(n)]
        forced = None if data.forced is None else data.forced[:n].tolist()
        return self.decode_ids(sources, opts, keep_attention, advance=advance, forced=forced)

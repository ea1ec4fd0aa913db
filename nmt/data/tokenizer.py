"""SentencePiece subword tokenizers: training (with an on-disk cache), encoding, decoding.

Every model uses the same special ids: PAD=0, UNK=1, BOS=2, EOS=3. Training uses the
``identity`` normalization, keeps repeated spaces and falls back to bytes for unseen
characters, so ``decode(encode(s)) == s`` for any stripped line ``s`` that does not contain
the whitespace marker U+2581 itself (it decodes to a space) or a carriage return. A decoded
text is one line: the line feed and carriage return that byte pieces can spell decode to
spaces, so that a file of outputs keeps one line per input.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from nmt.atomic import atomic_write_bytes
from nmt.cli import QUIET, Progress
from nmt.data.corpus import DataError
from nmt.data.spm_progress import followed

log = logging.getLogger(__name__)

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
ONE_LINE = str.maketrans("\n\r", "  ")  # what a decoded text must not hold: line breaks
SPECIAL_PIECES = ("<pad>", "<unk>", "<s>", "</s>")
_SKIP_ON_DECODE = frozenset((PAD_ID, BOS_ID, EOS_ID))
_CACHE_VERSION = 1  # bump when the training recipe changes, so old cache entries are ignored
MODEL_FILE = "spm.model"
# a multilingual model's target-language tags (<2fr>): user-defined pieces placed right after
# the special ones, so their ids are 4, 5, ... in the order given
TAG_PATTERN = re.compile(r"<2([A-Za-z0-9_]+)>")  # NLLB's codes have a script: deu_Latn
FIRST_TAG_ID = len(SPECIAL_PIECES)


def language_tag(lang: str) -> str:
    """The piece that asks for ``lang`` as the target language: ``<2fr>``."""
    return f"<2{lang}>"


class Tokenizer:
    """A trained SentencePiece model with the fixed special ids."""

    def __init__(self, processor: spm.SentencePieceProcessor) -> None:
        self._sp = processor
        ids = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise DataError(
                f"tokenizer uses pad/unk/bos/eos ids {ids}, expected "
                f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}"
            )
        self.tags = self._find_tags()
        self._skip = _SKIP_ON_DECODE | frozenset(self.tags.values())

    def _find_tags(self) -> dict[str, int]:
        """Language code -> id of the tags (user-defined pieces from id 4 on; none in a
        bilingual model, whose id 4 is an ordinary piece)."""
        tags: dict[str, int] = {}
        for i in range(FIRST_TAG_ID, self._sp.vocab_size()):
            match = TAG_PATTERN.fullmatch(self._sp.IdToPiece(i))
            if match is None:
                break
            tags[match.group(1)] = i
        return tags

    @classmethod
    def from_proto(cls, proto: bytes, origin: str = "model proto") -> Tokenizer:
        """Load from a serialized SentencePiece model (as stored in a checkpoint)."""
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(bytes(proto))
        except (RuntimeError, TypeError, ValueError) as err:
            raise DataError(f"{origin}: not a valid SentencePiece model ({err})") from err
        return cls(processor)

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load a ``.model`` file written by :meth:`save` or by SentencePiece."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as err:
            raise DataError(f"{path}: cannot read tokenizer model ({err})") from err
        return cls.from_proto(data, origin=str(path))

    def save(self, path: str | Path) -> None:
        """Write the model file atomically."""
        atomic_write_bytes(Path(path), self.proto)

    @property
    def proto(self) -> bytes:
        """The serialized model."""
        return self._sp.serialized_model_proto()

    @property
    def vocab_size(self) -> int:
        return self._sp.vocab_size()

    def encode(self, text: str) -> list[int]:
        """Subword ids of one sentence, without BOS/EOS."""
        return self._sp.Encode(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        """Subword ids of many sentences (multi-threaded: ``num_threads``, default all cores),
        without BOS/EOS."""
        if not texts:
            return []
        if num_threads is None:
            return self._sp.Encode(list(texts))
        return self._sp.Encode(list(texts), num_threads=num_threads)

    def sample_batch(self, texts: Sequence[str], alpha: float) -> list[list[int]]:
        """Subword ids of many sentences, each under a sampled segmentation (unigram: from
        all of them, weighted by probability ** ``alpha``; BPE: each merge dropped with
        probability ``alpha``), without BOS/EOS. One thread, drawing from SentencePiece's
        generator (:func:`sentencepiece.set_random_generator_seed` seeds it)."""
        if not texts:
            return []
        return self._sp.Encode(
            list(texts), enable_sampling=True, alpha=alpha, nbest_size=-1, num_threads=1
        )

    def decode(self, ids: Iterable[int]) -> str:
        """Text of a sequence of ids, on one line; PAD, BOS, EOS and language tags are
        ignored, and a line feed or carriage return (byte pieces) becomes a space."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()  # a tensor or array
        kept = [int(i) for i in ids if int(i) not in self._skip]
        return self._sp.Decode(kept).translate(ONE_LINE) if kept else ""

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """Human-readable subword pieces of ``ids`` (e.g. for attention plot labels)."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return [self._sp.IdToPiece(int(i)) for i in ids]


@dataclass
class TokenizerPair:
    """Source and target tokenizers; with ``joint`` they are the same object."""

    src: Tokenizer
    tgt: Tokenizer
    joint: bool
    # a model imported from a folder whose ids are not ours (M2M100, NLLB-200): its id behind
    # each of ours and its tokenizer's files, for an export back to that layout
    # (:mod:`nmt.ship.hf_m2m100`); plain data, never read as code
    origin: dict | None = None

    def state_dict(self) -> dict:
        """Plain data (bytes) for a checkpoint."""
        state = {"joint": self.joint, "src": self.src.proto}
        if not self.joint:
            state["tgt"] = self.tgt.proto
        if self.origin is not None:
            state["origin"] = self.origin
        return state

    def __reduce__(self) -> tuple:
        """Pickled as :meth:`state_dict` (a SentencePiece processor does not pickle): the
        server's decoding process hands its tokenizers to the server this way."""
        return (TokenizerPair.from_state_dict, (self.state_dict(),))

    @classmethod
    def from_state_dict(cls, state: dict) -> TokenizerPair:
        """Inverse of :meth:`state_dict`."""
        src = Tokenizer.from_proto(state["src"], origin="checkpoint source tokenizer")
        origin = state.get("origin")
        if state["joint"]:
            return cls(src=src, tgt=src, joint=True, origin=origin)
        tgt = Tokenizer.from_proto(state["tgt"], origin="checkpoint target tokenizer")
        return cls(src=src, tgt=tgt, joint=False, origin=origin)


def _trainer_options(
    vocab_size: int,
    model_type: str,
    character_coverage: float,
    input_sentence_size: int,
    seed: int,
    user_defined_symbols: Sequence[str] = (),
) -> dict:
    """Everything passed to the SentencePiece trainer (also part of the cache key)."""
    extra = {"user_defined_symbols": list(user_defined_symbols)} if user_defined_symbols else {}
    return {
        "vocab_size": int(vocab_size),
        "model_type": model_type,
        "character_coverage": float(character_coverage),
        "byte_fallback": True,
        "normalization_rule_name": "identity",
        "remove_extra_whitespaces": False,
        "pad_id": PAD_ID,
        "unk_id": UNK_ID,
        "bos_id": BOS_ID,
        "eos_id": EOS_ID,
        "pad_piece": SPECIAL_PIECES[PAD_ID],
        "unk_piece": SPECIAL_PIECES[UNK_ID],
        "bos_piece": SPECIAL_PIECES[BOS_ID],
        "eos_piece": SPECIAL_PIECES[EOS_ID],
        "input_sentence_size": int(input_sentence_size),
        "shuffle_input_sentence": True,
        "random_seed": int(seed),
        **extra,
    }


def cache_key(texts: Sequence[str], options: dict) -> str:
    """sha256 of the training sentences and the trainer options."""
    h = hashlib.sha256()
    h.update(json.dumps({"v": _CACHE_VERSION, **options}, sort_keys=True).encode())
    for text in texts:
        b = text.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def train_tokenizer(
    texts: Sequence[str],
    cache_dir: str | Path,
    vocab_size: int = 8000,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    *,
    input_sentence_size: int = 2_000_000,
    num_threads: int = 2,
    seed: int = 0,
    progress: Progress = QUIET,
    label: str = "sentencepiece",
    user_defined_symbols: Sequence[str] = (),
) -> Tokenizer:
    """Train SentencePiece on ``texts``, or reuse the model cached for the same inputs.

    The model lives in ``cache_dir/<sha256 of texts and options>/spm.model``, written
    atomically. Above ``input_sentence_size`` sentences the trainer uses a random sample.
    A vocabulary too large (or too small) for the text raises :class:`DataError`. A training
    draws its steps with ``progress``, as a bar labelled ``label``. ``user_defined_symbols``
    (a multilingual model's language tags) become pieces with ids 4, 5, ...
    """
    if not texts:
        raise DataError("cannot train a tokenizer: no training sentences")
    options = _trainer_options(
        vocab_size, model_type, character_coverage, input_sentence_size, seed,
        user_defined_symbols,
    )  # fmt: skip
    path = Path(cache_dir) / cache_key(texts, options) / MODEL_FILE
    cached = _load_cached(path)
    if cached is not None:
        log.info("reusing cached sentencepiece model %s (vocab %d)", path, cached.vocab_size)
        return cached
    tokenizer = _train(texts, options, num_threads, progress, label)
    tokenizer.save(path)
    log.info("saved sentencepiece model to %s", path)
    return tokenizer


def _load_cached(path: Path) -> Tokenizer | None:
    if not path.is_file():
        return None
    try:
        return Tokenizer.load(path)
    except DataError as err:
        log.warning("ignoring unreadable cached tokenizer: %s", err)
        return None


def _train(
    texts: Sequence[str], options: dict, num_threads: int, progress: Progress, label: str
) -> Tokenizer:
    """Run the SentencePiece trainer in memory (its steps drawn with ``progress``)."""
    opts = dict(options)
    seed = opts.pop("random_seed")
    spm.set_random_generator_seed(seed)
    buf = io.BytesIO()
    start = time.perf_counter()
    try:
        with followed(progress, label, opts["model_type"], opts["vocab_size"]) as logging_args:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(texts),
                model_writer=buf,
                num_threads=num_threads,
                **logging_args,
                **opts,
            )
    except RuntimeError as err:
        raise DataError(
            f"sentencepiece training failed on {len(texts)} sentences with "
            f"vocab_size={opts['vocab_size']}: {err}. For a small corpus set a smaller "
            "data.vocab_size (the message above gives the largest possible value); "
            "a vocabulary needs at least 260 entries plus the distinct characters"
        ) from err
    log.info(
        "trained sentencepiece %s model, vocab %d, on %d sentences in %.1fs",
        opts["model_type"],
        opts["vocab_size"],
        len(texts),
        time.perf_counter() - start,
    )
    return Tokenizer.from_proto(buf.getvalue())


def train_tokenizers(
    src_texts: Sequence[str],
    tgt_texts: Sequence[str],
    cache_dir: str | Path,
    joint: bool,
    **options,
) -> TokenizerPair:
    """One joint tokenizer on source + target text, or one tokenizer per side (their bars
    labelled ``sentencepiece src`` and ``sentencepiece tgt``)."""
    if joint:
        tok = train_tokenizer(list(src_texts) + list(tgt_texts), cache_dir, **options)
        return TokenizerPair(src=tok, tgt=tok, joint=True)
    src = train_tokenizer(src_texts, cache_dir, label="sentencepiece src", **options)
    tgt = train_tokenizer(tgt_texts, cache_dir, label="sentencepiece tgt", **options)
    return TokenizerPair(src=src, tgt=tgt, joint=False)

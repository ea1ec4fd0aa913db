"""The options of one decoding run, resolved, and the output caps they give (no PyTorch).

The options are declared once, in :class:`nmt.config.DecodeConfig`; :class:`DecodeOptions` is that
dataclass with every field set, as our search (:mod:`nmt.decode.search`), the CTranslate2 engine
(:mod:`nmt.decode.ct2`), the server and the trainer's validation read it. :meth:`DecodeOptions.caps`
is the one place that turns source lengths into output caps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from nmt.config import DecodeConfig
from nmt.config_checks import check_decode

# what beam and length_penalty are when neither the command nor the run sets them
GREEDY, DEFAULT_ALPHA = 1, 1.0


@dataclass
class DecodeOptions(DecodeConfig):
    """:class:`~nmt.config.DecodeConfig`'s fields with ``beam`` and ``length_penalty`` set (an
    unset one becomes greedy search and alpha 1); checked when built."""

    def __post_init__(self) -> None:
        if self.beam is None:
            self.beam = GREEDY
        if self.length_penalty is None:
            self.length_penalty = DEFAULT_ALPHA
        self.beam, self.length_penalty = int(self.beam), float(self.length_penalty)
        self.precision = str(self.precision)
        check_decode(self)

    @classmethod
    def from_config(cls, cfg: Any, run_decode: Any = None) -> DecodeOptions:
        """The options of a command's config (any :class:`DecodeConfig`, e.g. EvalConfig).

        ``beam`` and ``length_penalty`` left unset (None) come from ``run_decode``, the
        training run's ``decode`` section, else greedy search with alpha 1.
        """
        values = {f.name: getattr(cfg, f.name) for f in fields(DecodeConfig)}
        if values["sampling_topk"] != 1 and values["beam"] is None:
            values["beam"] = GREEDY  # sampling draws one translation: the run's beam is not it
        for key in ("beam", "length_penalty"):
            if values[key] is None and run_decode is not None:
                values[key] = run_decode.get(key)
        return cls(**values)

    @classmethod
    def of_run(cls, run_decode: Any) -> DecodeOptions:
        """How a run decodes when a command sets nothing: its ``decode`` section's beam and
        length penalty (None: greedy search, alpha 1) with the commands' defaults."""
        return cls.from_config(DecodeConfig(), run_decode)

    @property
    def samples(self) -> bool:
        """Whether these options draw translations at random (:mod:`nmt.decode.sampling`)
        instead of searching for them."""
        return self.sampling_topk != 1

    def caps(
        self, src_lens: Sequence[int] | np.ndarray, max_positions: int | None = None
    ) -> np.ndarray:
        """Output caps per sentence: ``max_output_len_a * source_length + max_output_len_b``
        tokens (EOS excluded), at least 1, and with ``max_positions`` (a model's position
        table) at most ``max_positions - 1``, as positions 0..cap are fed to the decoder.

        src_lens: (N,) source lengths as the caller counts them. The arithmetic is float32,
        whichever engine asks, so every engine gets the same caps. Returns (N,) int64.
        """
        lens = np.asarray(src_lens, dtype=np.float32)  # (N,)
        a, b = np.float32(self.max_output_len_a), np.float32(self.max_output_len_b)
        caps = np.maximum((lens * a + b).astype(np.int64), 1)  # (N,)
        if max_positions is not None:
            caps = np.minimum(caps, max_positions - 1)
        return caps

"""The options of a decoding run (search, caps, batching, precision), without PyTorch.

:class:`DecodeOptions` is read by our search (:mod:`nmt.search`, which re-exports it) and by the
CTranslate2 engine (:mod:`nmt.ct2`), which maps them onto CTranslate2's options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nmt.config import ConfigError


@dataclass
class DecodeOptions:
    beam: int = 1
    length_penalty: float = 1.0  # GNMT alpha (beam search only; 0 = none)
    max_len_a: float = 1.2  # output cap: a * source_length + b
    max_len_b: int = 10
    min_len: int = 0  # no EOS before this many tokens (unless the cap comes first)
    max_tokens: int = 8192  # token budget of a decoding batch
    precision: str = "32"  # 32 | bf16 | 16 | auto (bf16 on CUDA with it, else 32)

    @classmethod
    def from_config(cls, cfg: Any, run_decode: Any = None) -> DecodeOptions:
        """The checked options of an eval or translate config (EvalConfig, TranslateConfig).

        ``beam`` and ``length_penalty`` left unset (None) come from ``run_decode``, the
        training run's ``decode`` section, else greedy search with alpha 1.
        """

        def pick(key: str, fallback: Any) -> Any:
            if cfg[key] is not None:
                return cfg[key]
            if run_decode is not None and run_decode.get(key) is not None:
                return run_decode[key]
            return fallback

        opts = cls(
            beam=int(pick("beam", 1)),
            length_penalty=float(pick("length_penalty", 1.0)),
            max_len_a=cfg.max_output_len_a,
            max_len_b=cfg.max_output_len_b,
            min_len=cfg.min_output_len,
            max_tokens=cfg.max_tokens,
            precision=str(cfg.precision),
        )
        opts.validate()
        return opts

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid option."""
        if self.beam < 1:
            raise ConfigError(f"beam={self.beam} must be >= 1")
        if not self.length_penalty >= 0:
            raise ConfigError(f"length_penalty={self.length_penalty} must be >= 0")
        if self.max_len_a < 0 or self.max_len_b < 0:
            raise ConfigError(
                f"max_output_len_a={self.max_len_a} and max_output_len_b={self.max_len_b} "
                "must be >= 0"
            )
        if self.min_len < 0:
            raise ConfigError(f"min_output_len={self.min_len} must be >= 0")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens={self.max_tokens} must be >= 1")
        if str(self.precision) not in ("auto", "32", "bf16", "16"):
            raise ConfigError(f"precision={self.precision!r} is not one of: auto, 32, bf16, 16")

"""Translation: ``nmt-translate`` / ``make translate``.

Reads source sentences from ``input=FILE`` or stdin (an interactive prompt when stdin is a
terminal) and writes one translation per line to ``output=FILE`` or stdout. An empty line
translates to an empty line.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from nmt.checkpoint import CheckpointError, atomic_write_bytes
from nmt.config import ConfigError, register_configs
from nmt.data.corpus import DataError, read_lines
from nmt.data.prepare import encode_texts
from nmt.inference import Trained, checkpoint_path, load_trained
from nmt.runtime import config_dir, pick_device, setup_logging
from nmt.search import DecodeOptions, translate_dataset

log = logging.getLogger("nmt.translate")
register_configs()


def translate_lines(trained: Trained, lines: list[str], opts: DecodeOptions, device) -> list[str]:
    src = [line.strip() for line in lines]
    data = encode_texts(trained.tokenizers, src, [""] * len(src))
    hyps = translate_dataset(trained.model, data, trained.tokenizers.tgt, opts, device)
    return [h if s else "" for s, h in zip(src, hyps, strict=True)]


def interactive(trained: Trained, opts: DecodeOptions, device) -> None:
    print("Type a sentence and press Enter (Ctrl-D to quit).", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return
        print(translate_lines(trained, [line], opts, device)[0], flush=True)


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="translate")
def _main(cfg: DictConfig) -> None:
    setup_logging()
    logging.getLogger().setLevel(logging.WARNING)
    try:
        device = pick_device(cfg.device)
        trained = load_trained(checkpoint_path(cfg.run, cfg.ckpt), device)
        opts = DecodeOptions(
            beam=cfg.beam,
            length_penalty=cfg.length_penalty,
            max_len_a=cfg.max_output_len_a,
            max_len_b=cfg.max_output_len_b,
            max_tokens=cfg.max_tokens,
        )
        if cfg.input is None and sys.stdin.isatty():
            interactive(trained, opts, device)
            return
        lines = read_lines(Path(cfg.input)) if cfg.input else sys.stdin.read().split("\n")
        if cfg.input is None and lines and lines[-1] == "":
            lines.pop()  # the newline that ends the last line
        hyps = translate_lines(trained, lines, opts, device)
        text = "".join(h + "\n" for h in hyps)
        if cfg.output:
            atomic_write_bytes(Path(cfg.output), text.encode("utf-8"))
        else:
            sys.stdout.write(text)
    except (ConfigError, DataError, CheckpointError) as e:
        log.error("%s", e)
        raise SystemExit(2) from None


def main() -> None:
    _main()


if __name__ == "__main__":
    main()

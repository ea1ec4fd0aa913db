"""Translation: ``nmt-translate`` / ``make translate``.

Reads source sentences from ``input=FILE`` or stdin (an interactive prompt when stdin is a
terminal) and writes one translation per line to ``output=FILE`` or stdout. Search options are
those of ``nmt-eval`` (``beam``, ``length_penalty``, ``max_output_len_a/b``). An empty line
translates to an empty line; a line longer than anything seen in training still returns, its
output capped at ``max_output_len_a * length + max_output_len_b`` tokens. When standard error is
a terminal, a bar there counts the sentences translated (``progress=false``: none); stdout
carries the translations only.

``sampling_topk`` (with ``sampling_topp``, ``sampling_temperature``, ``sampling_seed``) draws
each translation at random instead (:mod:`nmt.decode.sampling`), the sources of
back-translation; a line's draws depend on the seed and the line's index only.

With ``n_best=N`` (N <= beam) every input line gives N lines
``<line index><TAB><score><TAB><translation>`` (index from 0, best first); an empty input line
gives one line with an empty translation and score 0.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from nmt.atomic import atomic_write_bytes
from nmt.cli import Advance, Progress, config_dir, exit_on_error, no_progress, setup_logging
from nmt.config import ConfigError, register_configs
from nmt.data.corpus import read_lines
from nmt.decode.engines import Engine, TorchEngine, make_engine
from nmt.decode.languages import Target, choose_target, target_dataset
from nmt.decode.options import DecodeOptions
from nmt.runtime.device import setup_device
from nmt.store.loading import Trained, decode_defaults, load_model
from nmt.store.package import model_argument

log = logging.getLogger(__name__)
register_configs()


def translate_lines(
    trained: Trained,
    lines: list[str],
    opts: DecodeOptions,
    device: torch.device,
    n_best: int = 1,
    engine: Engine | None = None,
    advance: Advance = no_progress,
    target: Target | None = None,
) -> list[list[tuple[str, float]]]:
    """Up to ``n_best`` (translation, score) pairs per input line, best first, in input order.

    Lines are stripped; an empty line gives ``[("", 0.0)]`` and is not decoded. ``engine``
    defaults to our search on ``trained.model``; ``advance`` is called with the lines done.
    ``target``: the language to translate into (:func:`~nmt.decode.languages.choose_target`;
    default: the model's only one); its tag never reaches the text.
    """
    if n_best > opts.beam:
        raise ConfigError(f"n_best={n_best} needs beam >= {n_best} (beam={opts.beam})")
    src = [line.strip() for line in lines]
    target = target or choose_target(trained.cfg, trained.tokenizers, None)
    data = target_dataset(trained.tokenizers, src, target)
    tgt = trained.tokenizers.tgt
    engine = engine or TorchEngine(trained.model, device)
    hyps = engine.hypotheses(data, opts, advance=advance)
    return [[(tgt.decode(t), s) for t, s in h.nbest[:n_best]] for h in hyps]


def format_lines(results: list[list[tuple[str, float]]], n_best: int) -> str:
    """The output text: one translation per line, or the n-best lines with index and score."""
    if n_best <= 1:
        return "".join(r[0][0] + "\n" for r in results)
    return "".join(
        f"{i}\t{score:.4f}\t{text}\n" for i, result in enumerate(results) for text, score in result
    )


def interactive(
    trained: Trained,
    opts: DecodeOptions,
    device: torch.device,
    n_best: int,
    engine: Engine,
    target: Target,
) -> None:
    """Translate each line typed at the prompt until end of input."""
    print("Type a sentence and press Enter (Ctrl-D to quit).", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return
        results = translate_lines(trained, [line], opts, device, n_best, engine, target=target)
        print(format_lines(results, n_best), end="", flush=True)


def read_input(cfg: DictConfig) -> list[str]:
    """The lines of ``input=FILE`` or of stdin."""
    if cfg.input:
        return read_lines(Path(cfg.input))
    lines = sys.stdin.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line.removesuffix("\r") for line in lines]


def translate(cfg: DictConfig) -> None:
    """Run one ``nmt-translate`` command."""
    device = setup_device(cfg.device, cfg.tf32)
    trained = load_model(cfg, device)
    target = choose_target(trained.cfg, trained.tokenizers, cfg.tgt_lang, cfg.src_lang)
    opts = DecodeOptions.from_config(cfg, decode_defaults(trained))
    if cfg.n_best < 1 or cfg.n_best > opts.beam:
        raise ConfigError(f"n_best={cfg.n_best} must be between 1 and beam={opts.beam}")
    engine = make_engine(cfg.engine, trained, opts, device)
    if cfg.input is None and sys.stdin.isatty():
        interactive(trained, opts, device, cfg.n_best, engine, target)
        return
    lines = read_input(cfg)
    label = Path(cfg.input).name if cfg.input else "stdin"
    with Progress(cfg.progress).bar(label, len(lines)) as advance:
        results = translate_lines(trained, lines, opts, device, cfg.n_best, engine, advance, target)
    text = format_lines(results, cfg.n_best)
    if cfg.output:
        atomic_write_bytes(Path(cfg.output), text.encode("utf-8"))
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="translate")
def _main(cfg: DictConfig) -> None:
    setup_logging()
    logging.getLogger().setLevel(logging.WARNING)
    with exit_on_error(log):
        translate(cfg)


def main() -> None:
    sys.argv[1:] = model_argument(sys.argv[1:])
    _main()


if __name__ == "__main__":
    main()

"""Settings of the JoeyNMT comparison, the checks before a run, JoeyNMT's venv and its
working folder (:mod:`benchmarks.joeynmt`).

:class:`Settings` and :func:`make_settings` hold what to compare and how long;
:func:`check_settings` and :func:`check_joey_python` find what stops a run before anything is
prepared; :func:`prepare_joey_dir` writes the Multi30k text files of ``<joey-dir>/data`` and
trains JoeyNMT's joint sentencepiece model when they are missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch
import yaml

from benchmarks.report import say as _say
from benchmarks.timing import StepSettings, WeightSource
from nmt.data.corpus import DataError, fetch_multi30k, read_lines
from nmt.environment import child_environment, multi30k_source

CPU = torch.device("cpu")


# ------------------------------------------------------------------------------ settings


@dataclass
class Settings:
    """What to compare and how long; :func:`make_settings` fills in the defaults."""

    joey_python: Path
    joey_dir: Path
    joey_configs: Path
    joey_ckpts: dict[str, Path | None]
    threads: int
    rounds: int
    steps: int
    warmup: int
    joey_steps: dict[str, int]
    joey_warmup: int
    joey_logging_freq: int
    joey_timeout: float
    precisions: list[str]
    max_tokens: dict[str, int]
    sentences: int
    max_output_length: int
    fixed_length: bool
    nmt_weights: str
    train: bool
    decode: bool
    out: Path
    quick: bool
    data_root: Path  # Multi30k for nmt, and the source of JoeyNMT's data/ files
    weights: WeightSource  # what nmt decodes

    @property
    def work(self) -> Path:
        """JoeyNMT's scratch folder for this benchmark (replaced at every run)."""
        return self.joey_dir / "nmt_bench"

    @property
    def nmt_steps(self) -> StepSettings:
        """How nmt's training steps are timed (on the CPU)."""
        return StepSettings(CPU, self.steps, self.warmup)


def _pick(value: int | None, quick: bool, full: int, short: int) -> int:
    return value if value is not None else (short if quick else full)


def _resolve(path: str | None) -> Path | None:
    return Path(path).expanduser().resolve() if path else None


def make_settings(
    *,
    joey_python: str,
    joey_dir: str,
    joey_configs: str,
    data_root: str,
    runs: str,
    out: str,
    joey_ckpt_transformer: str | None = None,
    joey_ckpt_rnn: str | None = None,
    ckpt_transformer: str | None = None,
    ckpt_gru: str | None = None,
    nmt_weights: str = "auto",
    threads: int = 2,
    rounds: int = 2,
    steps: int | None = None,
    warmup: int | None = None,
    joey_steps_transformer: int | None = None,
    joey_steps_rnn: int | None = None,
    joey_warmup: int | None = None,
    joey_logging_freq: int = 1,
    joey_timeout: float = 1800,
    precision: str = "32,bf16",
    max_tokens_transformer: int | None = None,
    max_tokens_gru: int | None = None,
    sentences: int | None = None,
    max_output_length: int = 60,
    fixed_length: bool = False,
    no_train: bool = False,
    no_decode: bool = False,
    quick: bool = False,
) -> Settings:
    """Settings with the defaults that depend on ``quick`` filled in and paths resolved."""
    checkpoints = {"transformer": _resolve(ckpt_transformer), "gru": _resolve(ckpt_gru)}
    runs_dir = Path(runs)
    if nmt_weights == "random":
        checkpoints, runs_dir = {"transformer": None, "gru": None}, Path("/nonexistent")
    return Settings(
        # kept as given: resolving would follow a venv's python symlink out of the venv
        joey_python=Path(os.path.abspath(os.path.expanduser(joey_python))),
        joey_dir=Path(joey_dir).expanduser().resolve(),
        joey_configs=Path(joey_configs).expanduser().resolve(),
        joey_ckpts={"transformer": _resolve(joey_ckpt_transformer), "rnn": _resolve(joey_ckpt_rnn)},
        threads=threads,
        rounds=rounds,
        steps=_pick(steps, quick, 20, 3),
        warmup=_pick(warmup, quick, 3, 1),
        joey_steps={
            "transformer": _pick(joey_steps_transformer, quick, 40, 5),
            "rnn": _pick(joey_steps_rnn, quick, 60, 5),
        },
        joey_warmup=_pick(joey_warmup, quick, 5, 2),
        joey_logging_freq=joey_logging_freq,
        joey_timeout=joey_timeout,
        precisions=[p.strip() for p in precision.split(",") if p.strip()],
        max_tokens={
            "transformer": max_tokens_transformer or 0,
            "gru_bahdanau": max_tokens_gru or 0,
        },
        sentences=_pick(sentences, quick, 1000, 50),
        max_output_length=max_output_length,
        fixed_length=fixed_length,
        nmt_weights=nmt_weights,
        train=not no_train,
        decode=not no_decode,
        out=Path(out.replace("<time>", time.strftime("%Y%m%d-%H%M%S"))),
        quick=quick,
        data_root=Path(data_root),
        weights=WeightSource(
            {k: str(v) if v else None for k, v in checkpoints.items()}, runs_dir, Path(data_root)
        ),
    )


JOEY_INSTALL = (
    "JoeyNMT 2.3.0 must be installed by hand in its own venv (README.md, 'Speed next to "
    "JoeyNMT'): python3 -m venv ../joeyvenv && ../joeyvenv/bin/pip install torch==2.13.0 "
    "joeynmt==2.3.0 importlib_metadata && ../joeyvenv/bin/pip install --only-binary :all: "
    "sentencepiece==0.2.0; then pass its python as JOEY_PYTHON (make) or --joey-python"
)


def check_settings(s: Settings) -> list[str]:
    """Problems that stop the run before anything is prepared or measured."""
    problems = []
    if not s.joey_python.is_file():
        problems.append(f"--joey-python {s.joey_python} does not exist. {JOEY_INSTALL}")
    if s.joey_dir.exists() and not s.joey_dir.is_dir():
        problems.append(f"--joey-dir {s.joey_dir} is not a directory")
    for stem in ("transformer", "rnn"):
        if not (s.joey_configs / f"{stem}.yaml").is_file():
            problems.append(
                f"no {stem}.yaml in {s.joey_configs} (--joey-configs; the repository's are in "
                "scripts/joeynmt)"
            )
    for name, ckpt in s.joey_ckpts.items():
        if ckpt is None:
            continue
        if not ckpt.exists():
            problems.append(f"--joey-ckpt-{name} {ckpt} does not exist")
        if s.work in ckpt.parents:
            problems.append(f"--joey-ckpt-{name} {ckpt} is inside {s.work}, which is replaced")
    bad = [p for p in s.precisions if p not in ("32", "bf16")]
    if bad or not s.precisions:
        problems.append(f"--precision {','.join(s.precisions)}: use 32 and/or bf16")
    if s.rounds < 1 or s.steps < 1 or s.warmup < 0 or s.threads < 1:
        problems.append("--rounds, --steps and --threads must be >= 1, --warmup >= 0")
    first_window = max(s.joey_warmup, s.joey_logging_freq)
    for name, n in s.joey_steps.items():
        if n < first_window + s.joey_logging_freq:
            problems.append(
                f"JoeyNMT {name}: {n} steps leave no timed logging window after "
                f"{first_window} warm-up steps"
            )
    if s.max_output_length < 2 or s.sentences < 1:
        problems.append("--max-output-length must be >= 2 and --sentences >= 1")
    return problems


def say(msg: str) -> None:
    """Progress on stderr."""
    _say("bench-joeynmt", msg)


# ------------------------------------------------------------------------------ JoeyNMT's venv


def joey_env(threads: int) -> dict[str, str]:
    env = child_environment(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.pop("PYTHONPATH", None)
    return env


def joey_versions(s: Settings) -> dict[str, Any]:
    code = (
        "import json, torch, joeynmt, sentencepiece; print(json.dumps({'joeynmt': "
        "joeynmt.__version__, 'torch': torch.__version__, 'torch_threads': "
        "torch.get_num_threads(), 'sentencepiece': sentencepiece.__version__, "
        "'set_vocabulary': hasattr(sentencepiece.SentencePieceProcessor, 'SetVocabulary')}))"
    )
    out = subprocess.run(
        [str(s.joey_python), "-c", code],
        cwd=s.joey_dir,
        env=joey_env(s.threads),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_joey_python(s: Settings) -> tuple[dict[str, Any], list[str]]:
    """The versions in JoeyNMT's venv, and what in it stops the run (nothing when it works)."""
    try:
        versions = joey_versions(s)
    except (subprocess.CalledProcessError, OSError, ValueError, IndexError) as err:
        detail = getattr(err, "stderr", None) or str(err)
        tail = " ".join(str(detail).strip().splitlines()[-1:])
        return {}, [
            f"{s.joey_python} cannot import joeynmt, torch and sentencepiece ({tail}). "
            + JOEY_INSTALL
        ]
    problems = []
    if not versions.get("set_vocabulary"):
        problems.append(
            f"sentencepiece {versions.get('sentencepiece')} in JoeyNMT's venv lacks the "
            "SetVocabulary JoeyNMT 2.3.0 calls: "
            f"{s.joey_python} -m pip install --only-binary :all: sentencepiece==0.2.0"
        )
    return versions, problems


# ------------------------------------------------------------------------------ JoeyNMT's folder

LANGS = ("de", "en")
# the plain-text files of <joey-dir>/data: name -> (Multi30k split, first lines only or None)
JOEY_DATA: dict[str, tuple[str, int | None]] = {
    "train": ("train", None),
    "val": ("val", None),
    "val300": ("val", 300),
    "test_2016_flickr": ("test_2016_flickr", None),
}
SPM_PREFIX = "spm/spm_joint8k"  # the model_file and voc_file of the configs, without suffix
JOEY_SPECIALS = ("<unk>", "<pad>", "<s>", "</s>")  # JoeyNMT's default unk/pad/bos/eos, ids 0-3
# the trainer options of JoeyNMT's own sentencepiece recipe, which its configs expect: its
# special pieces at ids 0-3 (its vocabulary puts them first and asserts their ids) and a .vocab
# of bare pieces, one per line (voc_file is read line by line, a line being one token). The
# recipe's accept_language is left out: it only labels the model, and newer sentencepiece warns
# that it ignores it.
SPM_OPTIONS: dict[str, Any] = {
    "model_type": "unigram",
    "vocab_size": 8000,
    "character_coverage": 1.0,
    **{f"{kind}_id": i for i, kind in enumerate(("unk", "pad", "bos", "eos"))},
    **{f"{kind}_piece": JOEY_SPECIALS[i] for i, kind in enumerate(("unk", "pad", "bos", "eos"))},
    "vocabulary_output_piece_score": False,
}


def joey_data_files(joey_dir: Path) -> list[Path]:
    """Every plain-text file of ``<joey-dir>/data`` the benchmark prepares."""
    return [joey_dir / "data" / f"{name}.{lang}" for name in JOEY_DATA for lang in LANGS]


def spm_files(joey_dir: Path) -> list[Path]:
    return [joey_dir / f"{SPM_PREFIX}.{suffix}" for suffix in ("model", "vocab")]


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` under a temporary name beside ``path``, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        tmp.write_text(text, encoding="utf-8", newline="\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_joey_data(corpus: Path, data_dir: Path) -> list[Path]:
    """Write the missing files of JoeyNMT's ``data_dir`` from Multi30k's ``<split>.<lang>.gz``.

    The lines are the corpus's own (read and checked as UTF-8 by nmt's reader), one per line;
    files already there are left alone. Returns the files written.
    """
    written = []
    for name, (split, first) in JOEY_DATA.items():
        for lang in LANGS:
            dest = data_dir / f"{name}.{lang}"
            if dest.is_file():
                continue
            lines = read_lines(corpus / f"{split}.{lang}.gz")
            if first is not None:
                if len(lines) < first:
                    raise DataError(f"{corpus / f'{split}.{lang}.gz'}: fewer than {first} lines")
                lines = lines[:first]
            _write_atomic(dest, "".join(line + "\n" for line in lines))
            written.append(dest)
    return written


def train_joey_spm(
    inputs: Sequence[Path], prefix: Path, threads: int, vocab_size: int = SPM_OPTIONS["vocab_size"]
) -> None:
    """Train JoeyNMT's joint sentencepiece model on ``inputs``: ``prefix``.model and .vocab.

    nmt's sentencepiece writes the same .model format as JoeyNMT's 0.2.0. Both files appear
    only once complete and checked: ids 0-3 carry JoeyNMT's special pieces, and the .vocab,
    split into lines as JoeyNMT splits it, lists exactly the model's pieces in id order.
    """
    sentences = [line for path in inputs for line in read_lines(path)]
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=prefix.parent, prefix=".spm-") as tmp:
        part = Path(tmp) / prefix.name
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences),
                model_prefix=str(part),
                num_threads=threads,
                minloglevel=1,
                **{**SPM_OPTIONS, "vocab_size": vocab_size},
            )
        except RuntimeError as err:
            names = ", ".join(str(p) for p in inputs)
            raise DataError(f"sentencepiece training on {names} failed: {err}") from err
        model = Path(f"{part}.model")
        vocab = Path(f"{part}.vocab")
        sp = spm.SentencePieceProcessor(model_file=str(model))
        pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
        if tuple(pieces[: len(JOEY_SPECIALS)]) != JOEY_SPECIALS:
            raise DataError(f"{model}: ids 0-3 are {pieces[:4]}, not JoeyNMT's {JOEY_SPECIALS}")
        if vocab.read_text(encoding="utf-8").splitlines() != pieces:
            raise DataError(f"{vocab}: its lines are not the model's pieces, one per line")
        os.replace(vocab, f"{prefix}.vocab")
        os.replace(model, f"{prefix}.model")


def prepare_joey_dir(
    joey_dir: Path, data_root: Path, threads: int, vocab_size: int = SPM_OPTIONS["vocab_size"]
) -> list[Path]:
    """Make what JoeyNMT's working folder lacks: data/ files, then the sentencepiece model.

    The Multi30k files come verified from ``<data_root>/multi30k`` (copied from
    NMT_MULTI30K_MIRROR or downloaded when missing, as for ``make train``). The sentencepiece
    model is trained when its .model or .vocab is missing. Returns the files made.
    """
    made: list[Path] = []
    if not all(p.is_file() for p in joey_data_files(joey_dir)):
        splits = list(dict.fromkeys(split for split, _ in JOEY_DATA.values()))
        corpus = fetch_multi30k(data_root, LANGS, splits, multi30k_source())
        say(f"writing JoeyNMT's Multi30k text files into {joey_dir / 'data'}")
        made += write_joey_data(corpus, joey_dir / "data")
    if not all(p.is_file() for p in spm_files(joey_dir)):
        say(f"training JoeyNMT's sentencepiece model {joey_dir / SPM_PREFIX}.model")
        inputs = [joey_dir / "data" / f"train.{lang}" for lang in LANGS]
        train_joey_spm(inputs, joey_dir / SPM_PREFIX, threads, vocab_size)
        made += spm_files(joey_dir)
    return made


def joey_files_missing(joey_dir: Path, configs: Path) -> list[str]:
    """The files JoeyNMT's configs name (data, sentencepiece) that ``joey_dir`` lacks."""
    missing = []
    for stem in ("transformer", "rnn"):
        cfg = yaml.safe_load((configs / f"{stem}.yaml").read_text(encoding="utf-8"))
        data = cfg["data"]
        needed = [
            (f"data.{key}", f"{data[key]}.{data[side]['lang']}")
            for key in ("train", "dev", "test")
            for side in ("src", "trg")
        ]
        for side in ("src", "trg"):
            needed.append((f"data.{side}.voc_file", data[side]["voc_file"]))
            needed.append(
                (f"data.{side}.tokenizer_cfg.model_file", data[side]["tokenizer_cfg"]["model_file"])
            )
        first_key: dict[str, str] = {}
        for key, name in needed:
            first_key.setdefault(name, key)
        for name, key in first_key.items():
            if not (joey_dir / name).is_file():
                missing.append(f"{configs / stem}.yaml: {key} names {joey_dir / name}, missing")
    return missing

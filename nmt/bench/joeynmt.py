"""Speed of nmt next to JoeyNMT 2.3.0 on the same CPU: ``make bench-joeynmt``.

One invocation measures both toolkits, one after the other and never at the same time, with
the same number of threads (``--threads``, default 2; ``OMP_NUM_THREADS``/``MKL_NUM_THREADS``
for JoeyNMT, ``torch.set_num_threads`` for nmt):

* training throughput, target tokens/s (EOS included, padding excluded), median over steps after
  a warm-up, for the Transformer 3+3 (d256, 4 heads, ff1024, tied) and the biGRU + Bahdanau
  model (emb 256, hidden 512), nmt in fp32 and bf16. JoeyNMT runs its own configs
  (``transformer.yaml``: 4096-token batches with padding; ``rnn.yaml``: 64 sentences) for a
  fixed number of updates, logging every step; its per-step "Tokens per Sec" lines are parsed
  and its first logging window (and ``--joey-warmup`` steps) left out. nmt's token budget
  (``data.max_tokens``) is chosen so that its mean target tokens per step equal the ones JoeyNMT
  measured in the first round (``--max-tokens-transformer/--max-tokens-gru`` fix it instead).
  The toolkits alternate (JoeyNMT, nmt, JoeyNMT, nmt, ...) for ``--rounds`` rounds, so that a
  drift in the machine's speed hits both.
* decoding speed on test_2016_flickr (first ``--sentences``): greedy and beam 5, sentences/s and
  decoder steps/s, with the same cap of ``--max-output-length`` decoder steps per sentence for
  both (JoeyNMT's ``max_output_length``; nmt: ``max_output_len_a=0``,
  ``max_output_len_b=cap - 1`` tokens plus EOS). Output lengths and the share of outputs that
  hit the cap are recorded, since a model whose outputs run to the cap does far more work per
  sentence; ``--fixed-length`` blocks
  EOS in both toolkits, so that every output runs to the cap and the work is equal whatever
  the weights. JoeyNMT decodes
  ``--joey-ckpt-transformer/--joey-ckpt-rnn`` when given, else the weights of its short
  benchmark training (marked ``untrained``); nmt decodes ``--ckpt-transformer/--ckpt-gru``, else
  the newest run under ``outputs/runs``, else random weights.

JoeyNMT runs from its own virtual environment (``--joey-python``, installed by hand: README,
"Speed next to JoeyNMT") in a working folder (``--joey-dir``) with the configs of
``scripts/joeynmt`` (``--joey-configs``). What that folder lacks is made first: the plain-text
Multi30k files of ``data/`` (train, val, val300 = the first 300 lines of val, test_2016_flickr;
de and en), written from the verified corpus that ``make train`` uses (``--data-root``, fetched
there if missing), and the joint sentencepiece model ``spm/spm_joint8k.model`` + ``.vocab``
trained on train.de + train.en with the options of JoeyNMT's own recipe::

    python scripts/bench_joeynmt.py --joey-python ../joeyvenv/bin/python --joey-dir ../joeywork
    python scripts/bench_joeynmt.py ... --quick      # a smoke run: a few steps, 50 sentences

Writes ``outputs/bench/joeynmt-vs-nmt-<timestamp>.json`` and prints tables with ratios
nmt / JoeyNMT. JoeyNMT's files go to ``<joey-dir>/nmt_bench/`` (replaced at every run).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm
import torch
import yaml
from omegaconf import DictConfig

from nmt.bench.machine import busy_warning, cpu_busy_share, load_average_or_none
from nmt.bench.report import SetupError, table
from nmt.bench.report import say as _say
from nmt.bench.timing import (
    DecodeSubject,
    StepSettings,
    WeightSource,
    compose_train_config,
    decode_subject,
    decode_with_search,
    time_training,
    training_batches,
)
from nmt.data.batching import TokenBatchSampler
from nmt.data.corpus import DataError, fetch_multi30k, read_lines
from nmt.data.prepare import PreparedData, prepare_data
from nmt.runtime import cpu_model, native_bf16
from nmt.search import DecodeOptions
from nmt.trained import build_model

CPU = torch.device("cpu")
SCHEMA = "nmt-vs-joeynmt/1"
BEAM = 5
# (our model config, JoeyNMT config file stem, label)
PAIRS = (("transformer", "transformer", "transformer"), ("gru_bahdanau", "rnn", "gru"))
DEFINITIONS = {
    "tgt_tokens_per_s": "non-pad target tokens (target + EOS) per second of a training step, "
    "median over the timed steps of all rounds (JoeyNMT: its 'Tokens per Sec' log lines, one "
    "per logging window, first window and warm-up steps left out)",
    "tgt_tokens_per_step_mean": "mean target tokens (with EOS) per update; JoeyNMT: total_tokens "
    "/ steps of its checkpoint (all steps of the segment)",
    "sentences_per_step_mean": "nmt: counted; JoeyNMT: its batch size for sentence batches, else "
    "tgt_tokens_per_step_mean / mean target tokens per training sentence (estimated)",
    "sentences_per_s": "sentences_per_step_mean / step_seconds_median",
    "step_seconds_median": "JoeyNMT: from the log timestamps of consecutive logging windows "
    "(divided by logging_freq)",
    "decode.seconds": "JoeyNMT: its 'Generation took' (the decoding loop); nmt: the search and "
    "detokenization, model loading excluded for both",
    "decode.decoder_steps": "decoder steps, EOS included: min(output tokens + 1, cap); JoeyNMT's "
    "output tokens are its detokenized outputs encoded again with its sentencepiece model",
    "decode.capped_share": "share of outputs that used all cap decoder steps",
}


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


def say(msg: str) -> None:
    """Progress on stderr."""
    _say("bench-joeynmt", msg)


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
        corpus = fetch_multi30k(data_root, LANGS, splits)
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


# ------------------------------------------------------------------------------ JoeyNMT runs


def joey_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.pop("PYTHONPATH", None)
    return env


@dataclass
class Process:
    rc: int
    seconds: float
    peak_rss_bytes: int
    started: float  # time.time() at start
    log: Path


def run_joey(s: Settings, args: list[str], log: Path) -> Process:
    """``<joey-python> -m joeynmt ARGS`` in the JoeyNMT folder; output into ``log``."""
    cmd = [str(s.joey_python), "-m", "joeynmt", *args]
    started, tic = time.time(), time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=s.joey_dir, env=joey_env(s.threads), stdout=out, stderr=subprocess.STDOUT
        )
        timer = threading.Timer(s.joey_timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    result = Process(
        proc.returncode, time.perf_counter() - tic, usage.ru_maxrss * 1024, started, log
    )
    if result.rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise RuntimeError(f"JoeyNMT failed (rc {result.rc}): {' '.join(cmd)}\n{tail}")
    return result


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


def joey_config(s: Settings, stem: str) -> dict[str, Any]:
    return yaml.safe_load((s.joey_configs / f"{stem}.yaml").read_text())


def write_yaml(path: Path, cfg: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


LOG_TIME = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
STEP_LINE = re.compile(LOG_TIME + r".*Step:\s+(\d+), .*Tokens per Sec:\s+([\d.]+)")
EPOCH_LINE = re.compile(LOG_TIME + r".*joeynmt\.training - EPOCH 1\b")
GEN_LINE = re.compile(r"Generation took ([\d.]+)\[sec\]")


def _log_time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def parse_train_log(text: str, logging_freq: int, skip: int) -> dict[str, Any]:
    """Per-window throughput of a JoeyNMT training log, windows ending after ``skip`` steps."""
    start = None
    windows = []  # (step, seconds since the previous log line, tokens/s)
    previous = None
    for line in text.splitlines():
        m = EPOCH_LINE.match(line)
        if m and start is None:
            start = previous = _log_time(m.group(1))
            continue
        m = STEP_LINE.match(line)
        if m and previous is not None:
            t = _log_time(m.group(1))
            windows.append((int(m.group(2)), t - previous, float(m.group(3))))
            previous = t
    if start is None or not windows:
        raise RuntimeError("no 'EPOCH 1' or 'Step: ... Tokens per Sec' lines in the JoeyNMT log")
    timed = [w for w in windows if w[0] - logging_freq >= skip]
    if not timed:
        raise RuntimeError(f"JoeyNMT logged no window after its first {skip} steps")
    seconds = [dt / logging_freq for _, dt, _ in timed]
    tokens = sum(dt * rate for _, dt, rate in timed)
    return {
        "first_log_time": start,
        "logged_windows": len(windows),
        "timed_windows": len(timed),
        "timed_steps": len(timed) * logging_freq,
        "window_tokens_per_s": [rate for _, _, rate in timed],
        "step_seconds": [round(x, 4) for x in seconds],
        "step_seconds_median": statistics.median(seconds),
        "tgt_tokens_per_s": statistics.median(rate for _, _, rate in timed),
        "tgt_tokens_per_s_overall": tokens / sum(dt for _, dt, _ in timed),
        "timed_tgt_tokens_per_step_estimate": tokens / (len(timed) * logging_freq),
    }


def checkpoint_stats(path: Path) -> dict[str, Any]:
    """JoeyNMT's training statistics stored in a checkpoint (steps, total_tokens, ...)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    return dict(state.get("stats_state", {}))


class JoeyTokenizer:
    """JoeyNMT's target sentencepiece model, to count the tokens of its inputs and outputs."""

    def __init__(self, s: Settings, cfg: dict[str, Any]) -> None:
        model = cfg["data"]["trg"]["tokenizer_cfg"]["model_file"]
        self.path = (s.joey_dir / model).resolve()
        self.sp = spm.SentencePieceProcessor(model_file=str(self.path))

    def count(self, lines: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self.sp.encode(list(lines))]


def joey_train(s: Settings, stem: str, steps: int, tokens_per_sentence: float) -> dict[str, Any]:
    """One JoeyNMT training segment of ``steps`` updates, without validation."""
    cfg = joey_config(s, stem)
    model_dir = s.work / f"train_{stem}"
    cfg["model_dir"] = str(model_dir)
    cfg["use_cuda"] = False
    cfg["fp16"] = False
    train = cfg["training"]
    train.update(
        updates=steps,
        logging_freq=s.joey_logging_freq,
        validation_freq=10 * steps + 10**6,
        overwrite=True,
    )
    path = write_yaml(s.work / f"train_{stem}.yaml", cfg)
    say(f"JoeyNMT {stem}: training {steps} updates")
    proc = run_joey(s, ["train", str(path), "-t"], s.work / f"train_{stem}.log")
    skip = max(s.joey_warmup, s.joey_logging_freq)
    parsed = parse_train_log(proc.log.read_text(errors="replace"), s.joey_logging_freq, skip)
    stats = checkpoint_stats(model_dir / "latest.ckpt")
    per_step = stats["total_tokens"] / max(stats["steps"], 1)
    if train.get("batch_type", "sentence") == "sentence":
        sentences, how = float(train["batch_size"]), "batch_size"
    else:
        sentences, how = per_step / tokens_per_sentence, "estimated"
    startup = parsed.pop("first_log_time") - proc.started
    params = re.findall(r"Total params: (\d+)", proc.log.read_text(errors="replace"))
    return {
        "config": stem,
        "batch_size": train["batch_size"],
        "batch_type": train.get("batch_type", "sentence"),
        "parameters": int(params[0]) if params else None,
        "updates": stats["steps"],
        "left_out_steps": skip,
        **parsed,
        "tgt_tokens_per_step_mean": per_step,
        "sentences_per_step_mean": sentences,
        "sentences_per_step_source": how,
        "startup_seconds": startup,
        "process_seconds": proc.seconds,
        "peak_rss_bytes": proc.peak_rss_bytes,
        "checkpoint": str((model_dir / "latest.ckpt").resolve()),
        "log": str(proc.log),
    }


def test_subset(s: Settings, test_prefix: str) -> str:
    """The JoeyNMT data prefix of the first ``s.sentences`` test sentences."""
    src = s.joey_dir / f"{test_prefix}.de"
    with src.open(encoding="utf-8") as f:
        total = sum(1 for _ in f)
    if s.sentences >= total:
        return test_prefix
    prefix = s.work / f"test_first{s.sentences}"
    for lang in ("de", "en"):
        lines = (s.joey_dir / f"{test_prefix}.{lang}").read_text(encoding="utf-8").splitlines()
        Path(f"{prefix}.{lang}").write_text("\n".join(lines[: s.sentences]) + "\n")
    return str(prefix)


def joey_decode(
    s: Settings, stem: str, ckpt: Path, beam: int, tokenizer: JoeyTokenizer
) -> dict[str, Any]:
    """JoeyNMT ``test`` on the test subset with one checkpoint and beam size."""
    cfg = joey_config(s, stem)
    decode_dir = s.work / "decode"
    decode_dir.mkdir(parents=True, exist_ok=True)
    cfg["model_dir"] = str(decode_dir)
    cfg["use_cuda"] = False
    cfg["fp16"] = False
    cfg["data"].pop("train", None)
    cfg["data"].pop("dev", None)
    cfg["data"]["test"] = test_subset(s, cfg["data"]["test"])
    cfg["testing"].update(
        load_model=str(ckpt), beam_size=beam, max_output_length=s.max_output_length
    )
    if s.fixed_length:  # EOS blocked at every step before the cap
        cfg["testing"]["min_output_length"] = s.max_output_length
    name = f"{stem}.beam{beam}"
    path = write_yaml(s.work / f"decode_{name}.yaml", cfg)
    out = decode_dir / name
    say(f"JoeyNMT {stem}: decoding {s.sentences} sentences, beam {beam}")
    proc = run_joey(s, ["test", str(path), "-o", str(out)], s.work / f"decode_{name}.log")
    found = GEN_LINE.findall(proc.log.read_text(errors="replace"))
    if not found:
        raise RuntimeError(f"no 'Generation took' line in {proc.log}")
    seconds = float(found[-1])
    hyps = Path(f"{out}.test").read_text(encoding="utf-8").splitlines()
    # encoding the detokenized text again can split it a little differently: clip to the cap
    lengths = [min(n, s.max_output_length) for n in tokenizer.count(hyps)]
    stats = decode_stats(lengths, seconds, s.max_output_length)
    stats.update(
        batch=f"{cfg['testing']['batch_size']} {cfg['testing'].get('batch_type', 'sentence')}s",
        process_seconds=proc.seconds,
        peak_rss_bytes=proc.peak_rss_bytes,
        hypotheses=f"{out}.test",
        log=str(proc.log),
    )
    return stats


def decode_stats(lengths: Sequence[int], seconds: float, cap: int) -> dict[str, Any]:
    """Speed and output lengths of a decoding run; ``lengths`` exclude EOS."""
    steps = [min(n + 1, cap) for n in lengths]
    n = max(len(lengths), 1)
    return {
        "sentences": len(lengths),
        "seconds": seconds,
        "sentences_per_s": len(lengths) / seconds,
        "decoder_steps": sum(steps),
        "decoder_steps_per_s": sum(steps) / seconds,
        "mean_output_tokens": sum(lengths) / n,
        "capped_share": sum(x >= cap for x in steps) / n,
    }


# ------------------------------------------------------------------------------ nmt runs


def batch_means(data: PreparedData, max_tokens: int, seed: int) -> tuple[float, float]:
    """Mean target tokens (with EOS) and sentences per batch over a whole epoch."""
    sampler = TokenBatchSampler(data.train.src_lens, data.train.tgt_lens, max_tokens, seed=seed)
    n_batches = len(sampler.batches(0))
    tokens = int(data.train.tgt_lens.sum()) + len(data.train)
    return tokens / n_batches, len(data.train) / n_batches


def match_max_tokens(data: PreparedData, target: float, seed: int) -> dict[str, Any]:
    """The ``data.max_tokens`` whose batches hold ``target`` target tokens on average."""
    lo = int(np.max(np.maximum(data.train.src_lens, data.train.tgt_lens))) + 1
    hi = max(lo, 1 << 17)
    while lo < hi:  # smallest budget reaching the target
        mid = (lo + hi) // 2
        if batch_means(data, mid, seed)[0] >= target:
            hi = mid
        else:
            lo = mid + 1
    best = min((lo - 1, lo), key=lambda m: abs(batch_means(data, max(m, 1), seed)[0] - target))
    tokens, sentences = batch_means(data, best, seed)
    return {
        "max_tokens": best,
        "target_tgt_tokens_per_step": target,
        "epoch_tgt_tokens_per_step": tokens,
        "epoch_sentences_per_step": sentences,
    }


def nmt_train(
    model: str, cfg: DictConfig, data: PreparedData, precision: str, s: Settings
) -> dict[str, Any]:
    """One nmt training segment (the speed benchmark's timing) in ``precision``."""
    say(f"nmt {model}: training {s.warmup} + {s.steps} steps in {precision}")
    result = time_training(cfg, data, precision, s.nmt_steps, 1.0)
    for key in ("mfu", "peak_tflops", "forward_flops_share"):
        result.pop(key, None)
    batches = training_batches(cfg, data, s.warmup + s.steps)[s.warmup :]
    tokens = [int(data.train.tgt_lens[b].sum()) + len(b) for b in batches]
    result["step_tgt_tokens"] = tokens
    result["step_tokens_per_s"] = [
        n / t for n, t in zip(tokens, result["step_seconds"], strict=True)
    ]
    return result


def nmt_decode(
    model: str, subject: DecodeSubject, cfg: DictConfig, beam: int, s: Settings
) -> dict[str, Any]:
    opts = DecodeOptions(
        beam=beam,
        length_penalty=1.0,
        max_output_len_a=0.0,
        max_output_len_b=s.max_output_length - 1,
        min_output_len=s.max_output_length - 1 if s.fixed_length else 0,
        max_tokens=int(cfg.data.eval_max_tokens),
        precision="32",
    )
    n = min(s.sentences, len(subject.test.data))
    say(f"nmt {model}: decoding {n} sentences, beam {beam}")
    outputs, seconds = decode_with_search(subject, opts, n, CPU)
    stats = decode_stats([len(t) for t in outputs], seconds, s.max_output_length)
    stats["batch"] = f"{opts.max_tokens} tokens"
    return stats


# ------------------------------------------------------------------------------ the comparison


def summarize_joey(segments: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r for seg in segments for r in seg["window_tokens_per_s"]]
    seconds = [t for seg in segments for t in seg["step_seconds"]]
    per_step = statistics.mean(seg["tgt_tokens_per_step_mean"] for seg in segments)
    sentences = statistics.mean(seg["sentences_per_step_mean"] for seg in segments)
    return {
        "tgt_tokens_per_s": statistics.median(rates),
        "tgt_tokens_per_s_by_round": [seg["tgt_tokens_per_s"] for seg in segments],
        "step_seconds_median": statistics.median(seconds),
        "tgt_tokens_per_step_mean": per_step,
        "sentences_per_step_mean": sentences,
        "sentences_per_step_source": segments[0]["sentences_per_step_source"],
        "sentences_per_s": sentences / statistics.median(seconds),
        "peak_rss_bytes": max(seg["peak_rss_bytes"] for seg in segments),
        "rounds": segments,
    }


def summarize_nmt(segments: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r for seg in segments for r in seg["step_tokens_per_s"]]
    seconds = [t for seg in segments for t in seg["step_seconds"]]
    tokens = [n for seg in segments for n in seg["step_tgt_tokens"]]
    sentences = statistics.mean(seg["sentences_per_step_mean"] for seg in segments)
    return {
        "tgt_tokens_per_s": statistics.median(rates),
        "tgt_tokens_per_s_by_round": [seg["tgt_tokens_per_s"] for seg in segments],
        "step_seconds_median": statistics.median(seconds),
        "tgt_tokens_per_step_mean": statistics.mean(tokens),
        "sentences_per_step_mean": sentences,
        "sentences_per_step_source": "counted",
        "sentences_per_s": sentences / statistics.median(seconds),
        "peak_rss_bytes": max(seg["peak_memory_bytes"] for seg in segments),
        "rounds": segments,
    }


def joey_tokens_per_sentence(s: Settings, tokenizer: JoeyTokenizer) -> float:
    cfg = joey_config(s, "transformer")
    trg = cfg["data"]["trg"]["lang"]
    lines = (s.joey_dir / f"{cfg['data']['train']}.{trg}").read_text(encoding="utf-8").splitlines()
    counts = tokenizer.count(lines)
    return sum(counts) / len(counts) + 1  # + EOS


def nmt_config(
    model: str, data: PreparedData, target: float, s: Settings
) -> tuple[DictConfig, dict[str, Any]]:
    """nmt's training config for ``model`` with its token budget, and how it was chosen."""
    cfg = compose_train_config(model, s.data_root, CPU)
    seed = int(cfg.trainer.seed)
    given = s.max_tokens[model]
    if given:
        info: dict[str, Any] = {"max_tokens": given, "how": "given"}
    else:
        info = match_max_tokens(data, target, seed)
        info["how"] = "matched to JoeyNMT's target tokens per step in round 1"
    tokens, sentences = batch_means(data, info["max_tokens"], seed)
    info.update(epoch_tgt_tokens_per_step=tokens, epoch_sentences_per_step=sentences)
    cfg = compose_train_config(model, s.data_root, CPU, info["max_tokens"])
    return cfg, {"max_tokens": info}


def compare_training(
    s: Settings, data: PreparedData, tokenizer: JoeyTokenizer, joey_tps: float
) -> dict[str, Any]:
    """ABAB: per round, JoeyNMT then nmt for each model pair."""
    out: dict[str, Any] = {}
    joey: dict[str, list[dict[str, Any]]] = {stem: [] for _, stem, _ in PAIRS}
    ours: dict[str, dict[str, list[dict[str, Any]]]] = {
        model: {p: [] for p in s.precisions} for model, _, _ in PAIRS
    }
    cfgs: dict[str, DictConfig] = {}
    for r in range(s.rounds):
        say(f"training round {r + 1} of {s.rounds}")
        for model, stem, label in PAIRS:
            joey[stem].append(joey_train(s, stem, s.joey_steps[stem], joey_tps))
            if model not in cfgs:
                target = joey[stem][0]["tgt_tokens_per_step_mean"]
                cfgs[model], out[label] = nmt_config(model, data, target, s)
                say(f"nmt {model}: data.max_tokens={cfgs[model].data.max_tokens}")
            order = s.precisions if r % 2 == 0 else s.precisions[::-1]
            for precision in order:
                ours[model][precision].append(nmt_train(model, cfgs[model], data, precision, s))
    for model, stem, label in PAIRS:
        out[label]["joeynmt"] = summarize_joey(joey[stem])
        out[label]["joeynmt_parameters"] = joey[stem][0]["parameters"]
        out[label]["nmt"] = {p: summarize_nmt(ours[model][p]) for p in s.precisions}
        out[label]["nmt_parameters"] = build_model(cfgs[model], data.tokenizers).num_parameters()
    return out


def joey_decode_checkpoint(s: Settings, stem: str) -> tuple[Path | None, str]:
    given = s.joey_ckpts[stem]
    if given is not None:
        return given, "trained"
    own = s.work / f"train_{stem}" / "latest.ckpt"
    if own.exists():
        return own, "untrained"
    return None, "none"


def compare_decoding(s: Settings, data: PreparedData, tokenizer: JoeyTokenizer) -> dict[str, Any]:
    """Per model pair: JoeyNMT greedy, nmt greedy, JoeyNMT beam, nmt beam."""
    out: dict[str, Any] = {}
    for model, stem, label in PAIRS:
        ckpt, weights = joey_decode_checkpoint(s, stem)
        if ckpt is None:
            say(f"JoeyNMT {stem}: no checkpoint to decode (train first or --joey-ckpt-{stem})")
            continue
        stats = checkpoint_stats(ckpt)
        cfg = compose_train_config(model, s.data_root, CPU)
        subject = decode_subject(model, cfg, data, CPU, s.weights, say)
        warm = DecodeOptions(
            max_output_len_a=0.0, max_output_len_b=s.max_output_length - 1, precision="32"
        )
        decode_with_search(subject, warm, min(16, len(subject.test.data)), CPU)
        entry: dict[str, Any] = {
            "joeynmt": {
                "checkpoint": str(ckpt),
                "weights": weights,
                "checkpoint_steps": stats.get("steps"),
                "runs": {},
            },
            "nmt": {
                "checkpoint": subject.checkpoint,
                "weights": subject.weights,
                "checkpoint_steps": subject.step,
                "runs": {},
            },
        }
        for beam in (1, BEAM):
            run = "greedy" if beam == 1 else f"beam{beam}"
            entry["joeynmt"]["runs"][run] = joey_decode(s, stem, ckpt, beam, tokenizer)
            entry["nmt"]["runs"][run] = nmt_decode(model, subject, cfg, beam, s)
        out[label] = entry
        del subject
    return out


def machine(s: Settings) -> dict[str, Any]:
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": s.threads,
        "nmt_torch": torch.__version__,
        "nmt_torch_threads": torch.get_num_threads(),
        "native_bf16": native_bf16(torch.device("cpu")),
        "nice": os.nice(0),
        "load_average_start": load_average_or_none(),
        "cpu_busy_share_start": cpu_busy_share(),
    }


def run(s: Settings, joey: dict[str, Any]) -> dict[str, Any]:
    """Both comparisons in a prepared JoeyNMT folder; ``joey``: its venv's versions."""
    start = time.perf_counter()
    torch.set_num_threads(s.threads)
    if s.work.exists():
        shutil.rmtree(s.work)
    s.work.mkdir(parents=True)
    info = machine(s)
    info["joeynmt"] = joey
    say(f"JoeyNMT {info['joeynmt']['joeynmt']} with torch {info['joeynmt']['torch']}")
    cfg = compose_train_config("transformer", s.data_root, CPU)
    say("preparing nmt data")
    data = prepare_data(cfg.data)
    tokenizer = JoeyTokenizer(s, joey_config(s, "transformer"))
    joey_tps = joey_tokens_per_sentence(s, tokenizer)
    ours_tps = float(data.train.tgt_lens.mean()) + 1
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": s.quick,
        "settings": {
            "threads": s.threads,
            "rounds": s.rounds,
            "nmt_steps": s.steps,
            "nmt_warmup": s.warmup,
            "joey_steps": s.joey_steps,
            "joey_warmup": s.joey_warmup,
            "joey_logging_freq": s.joey_logging_freq,
            "precisions": s.precisions,
            "sentences": s.sentences,
            "max_output_length": s.max_output_length,
            "fixed_length": s.fixed_length,
            "beam": BEAM,
            "length_penalty": 1.0,
            "joey_dir": str(s.joey_dir),
            "joey_configs": str(s.joey_configs),
            "nmt_weights": s.nmt_weights,
        },
        "definitions": DEFINITIONS,
        "machine": info,
        "tokenizers": {
            "joeynmt_tgt_tokens_per_train_sentence": joey_tps,
            "nmt_tgt_tokens_per_train_sentence": ours_tps,
            "joeynmt_spm": str(tokenizer.path),
        },
    }
    if s.train:
        result["train"] = compare_training(s, data, tokenizer, joey_tps)
    if s.decode:
        result["decode"] = compare_decoding(s, data, tokenizer)
    result["machine"]["load_average_end"] = load_average_or_none()
    result["seconds"] = time.perf_counter() - start
    return result


# ------------------------------------------------------------------------------ report


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def training_table(train: dict[str, Any]) -> str:
    header = [
        "model", "toolkit", "prec", "tgt tok/step", "sent/step", "step s", "tgt tok/s",
        "sent/s", "tok/s ratio", "sent/s ratio",
    ]  # fmt: skip
    rows = []
    for label, t in train.items():
        j = t["joeynmt"]
        est = "~" if j["sentences_per_step_source"] == "estimated" else ""
        rows.append([
            label, "JoeyNMT", "32", f"{j['tgt_tokens_per_step_mean']:.0f}",
            f"{est}{j['sentences_per_step_mean']:.1f}", f"{j['step_seconds_median']:.3f}",
            f"{j['tgt_tokens_per_s']:.0f}", f"{est}{j['sentences_per_s']:.1f}", "1", "1",
        ])  # fmt: skip
        for prec, n in t["nmt"].items():
            rows.append([
                label, "nmt", prec, f"{n['tgt_tokens_per_step_mean']:.0f}",
                f"{n['sentences_per_step_mean']:.1f}", f"{n['step_seconds_median']:.3f}",
                f"{n['tgt_tokens_per_s']:.0f}", f"{n['sentences_per_s']:.1f}",
                _ratio(n["tgt_tokens_per_s"], j["tgt_tokens_per_s"]),
                _ratio(n["sentences_per_s"], j["sentences_per_s"]),
            ])  # fmt: skip
    return table(header, rows)


def decoding_table(decode: dict[str, Any]) -> str:
    header = [
        "model", "toolkit", "weights", "run", "sents", "seconds", "sent/s", "steps/s",
        "tok/sent", "capped", "sent/s ratio",
    ]  # fmt: skip
    rows = []
    for label, d in decode.items():
        for run_name, j in d["joeynmt"]["runs"].items():
            n = d["nmt"]["runs"][run_name]
            for toolkit, r, ratio in (
                ("JoeyNMT", j, "1"),
                ("nmt", n, _ratio(n["sentences_per_s"], j["sentences_per_s"])),
            ):
                key = "joeynmt" if toolkit == "JoeyNMT" else "nmt"
                rows.append([
                    label, toolkit, d[key]["weights"], run_name, str(r["sentences"]),
                    f"{r['seconds']:.2f}", f"{r['sentences_per_s']:.1f}",
                    f"{r['decoder_steps_per_s']:.0f}", f"{r['mean_output_tokens']:.1f}",
                    f"{100 * r['capped_share']:.0f}%", ratio,
                ])  # fmt: skip
    return table(header, rows)


def report(result: dict[str, Any]) -> str:
    m = result["machine"]
    j = m["joeynmt"]
    lines = [
        f"CPU: {m['cpu_model']} ({m['cpu_count']} cores), {m['threads']} threads per toolkit, "
        f"nice {m['nice']}; nmt torch {m['nmt_torch']}; JoeyNMT {j['joeynmt']} with torch "
        f"{j['torch']}",
    ]
    warning = busy_warning(m)
    if warning:
        lines.append(warning)
    if result["quick"]:
        lines.append("QUICK RUN: a few steps and sentences; the figures are noisy")
    tok = result["tokenizers"]
    lines.append(
        f"target tokens per training sentence (with EOS): JoeyNMT "
        f"{tok['joeynmt_tgt_tokens_per_train_sentence']:.2f}, nmt "
        f"{tok['nmt_tgt_tokens_per_train_sentence']:.2f}"
    )
    if "train" in result:
        lines += ["", "training (median over timed steps of all rounds; ratio = nmt / JoeyNMT)"]
        lines.append(training_table(result["train"]))
        for label, t in result["train"].items():
            mt = t["max_tokens"]
            lines.append(
                f"{label}: parameters JoeyNMT {t['joeynmt_parameters']:,}, nmt "
                f"{t['nmt_parameters']:,}; nmt data.max_tokens={mt['max_tokens']} ({mt['how']}); "
                f"JoeyNMT batch {t['joeynmt']['rounds'][0]['batch_size']} "
                f"{t['joeynmt']['rounds'][0]['batch_type']}s; by round, tgt tok/s JoeyNMT "
                + ", ".join(f"{x:.0f}" for x in t["joeynmt"]["tgt_tokens_per_s_by_round"])
                + "; nmt "
                + "; ".join(
                    f"{p} " + ", ".join(f"{x:.0f}" for x in n["tgt_tokens_per_s_by_round"])
                    for p, n in t["nmt"].items()
                )
            )
        lines.append("~ = estimated from target tokens per step and per sentence")
    if result.get("decode"):
        cap = result["settings"]["max_output_length"]
        lines += [
            "",
            f"decoding test_2016_flickr (at most {cap} decoder steps per sentence, EOS "
            "included; tok/sent without EOS; ratio = nmt / JoeyNMT)",
        ]
        lines.append(decoding_table(result["decode"]))
        for label, d in result["decode"].items():
            for key, name in (("joeynmt", "JoeyNMT"), ("nmt", "nmt")):
                e = d[key]
                lines.append(
                    f"{label} {name}: {e['weights']} weights, {e['checkpoint'] or 'no checkpoint'}"
                    f" (step {e['checkpoint_steps']})"
                )
        weights = {d[k]["weights"] for d in result["decode"].values() for k in ("joeynmt", "nmt")}
        if result["settings"]["fixed_length"]:
            lines.append(
                f"fixed length: EOS blocked in both toolkits, every output runs {cap} decoder "
                "steps; the work per sentence is the same whatever the weights"
            )
        elif weights != {"trained"}:
            lines.append(
                "NOT COMPARABLE WORK: some models decoded are not trained (their outputs run to "
                "the cap); compare decoder steps/s, or give trained checkpoints "
                "(--joey-ckpt-transformer/--joey-ckpt-rnn, --ckpt-transformer/--ckpt-gru)"
            )
    return "\n".join(lines)


def compare(s: Settings) -> dict[str, Any]:
    """Check the settings and JoeyNMT's venv, make what its folder lacks, then run both
    comparisons; SetupError says what stops the run before anything is measured."""
    problems = check_settings(s)
    if problems:
        raise SetupError("\n".join(problems))
    s.joey_dir.mkdir(parents=True, exist_ok=True)
    joey, problems = check_joey_python(s)
    if problems:
        raise SetupError("\n".join(problems))
    try:
        prepare_joey_dir(s.joey_dir, s.data_root, s.threads)
    except DataError as err:
        raise SetupError(f"preparing JoeyNMT's folder {s.joey_dir}: {err}") from err
    problems = joey_files_missing(s.joey_dir, s.joey_configs)
    if problems:
        raise SetupError("\n".join(problems))
    return run(s, joey)

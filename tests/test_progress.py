"""The progress bars: training's counts toward whichever limit ends the run first; preparation,
evaluation and translation count their corpora's bytes and their sentences. Every bar is drawn
on a terminal only."""

from __future__ import annotations

import fcntl
import gzip
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from nmt.cli import QUIET, Progress
from nmt.config import TransformerConfig
from nmt.data.batching import TokenDataset
from nmt.data.binarize import ensure_prepared
from nmt.data.corpus import DataError, iter_line_blocks, read_lines
from nmt.data.spm_progress import LogReader, TrainerSteps
from nmt.data.tokenizer import train_tokenizer
from nmt.decode.options import DecodeOptions
from nmt.decode.search import decode_dataset
from nmt.models.registry import create_model
from nmt.train.progress import (
    Limits,
    Position,
    ProgressBar,
    format_duration,
    seconds_left,
    share_done,
)

from .helpers import compose_config, corpus_overrides, tiny_run_overrides


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_share_is_that_of_the_limit_nearest_to_being_reached() -> None:
    at = Position(step=100, train_time=600.0, epochs=2.5)
    assert share_done(Limits(max_steps=1000), at) == pytest.approx(0.1)
    assert share_done(Limits(time_limit=1800.0), at) == pytest.approx(1 / 3)
    assert share_done(Limits(max_epochs=10), at) == pytest.approx(0.25)
    both = Limits(max_steps=1000, time_limit=1800.0, max_epochs=10)
    assert share_done(both, at) == pytest.approx(1 / 3)
    assert share_done(Limits(), at) is None
    assert share_done(Limits(max_steps=50), at) == 1.0  # a resumed run past a lowered limit


def test_the_time_left_is_the_least_any_limit_leaves_at_the_rate_so_far() -> None:
    at = Position(step=100, train_time=600.0, epochs=2.0)  # 6 s a step, 300 s an epoch
    assert seconds_left(Limits(time_limit=1800.0), at) == pytest.approx(1200.0)
    assert seconds_left(Limits(max_steps=150), at) == pytest.approx(300.0)
    assert seconds_left(Limits(max_epochs=3), at) == pytest.approx(300.0)
    assert seconds_left(Limits(max_steps=1000, time_limit=1800.0), at) == pytest.approx(1200.0)
    assert seconds_left(Limits(max_steps=10), Position(0, 0.0, 0.0)) is None  # no rate yet
    assert seconds_left(Limits(), at) is None
    assert format_duration(3725) == "1:02:05" and format_duration(65.4) == "1:05"


def test_on_a_terminal_the_bar_shows_step_time_left_and_the_figures() -> None:
    out = Terminal()
    bar = ProgressBar(Limits(max_steps=10, time_limit=100.0), enabled=True, stream=out)
    bar.show(Position(5, 20.0, 0.5), loss="4.321", **{"tokens/s": "4,800"})
    bar.show(Position(6, 24.0, 0.6), BLEU="12.30")
    bar.close()
    last = out.getvalue().split("\r")[-1]
    assert "60%" in last and "step 6/10" in last and "0:24 < 0:16 left" in last
    assert "loss 4.321" in last and "tokens/s 4,800" in last and "BLEU 12.30" in last


def test_off_a_terminal_or_when_disabled_nothing_is_drawn() -> None:
    for stream, enabled in ((io.StringIO(), True), (Terminal(), False)):
        bar = ProgressBar(Limits(max_steps=10), enabled=enabled, stream=stream)
        bar.show(Position(5, 20.0, 0.5), loss="1.0")
        bar.close()
        assert stream.getvalue() == ""


# ------------------------------------------------------------- the bars of the other commands


def test_a_bar_draws_its_label_and_counts_to_its_total_on_a_terminal() -> None:
    out = Terminal()
    with Progress(stream=out).bar("test2016", 5) as advance:
        advance(2)
        advance(3)
    last = out.getvalue().rstrip("\n").split("\r")[-1]
    assert last.startswith("test2016:") and "100%|" in last and "5/5" in last
    out = Terminal()
    with Progress(stream=out).bar("encode train", 3 << 20, in_bytes=True) as advance:
        advance(3 << 20)
    assert "3.00M/3.00M" in out.getvalue()


def test_off_a_terminal_or_when_disabled_a_bar_draws_nothing() -> None:
    for stream, enabled in ((io.StringIO(), True), (Terminal(), False)):
        with Progress(enabled, stream).bar("test", 3) as advance:
            advance(3)
        assert stream.getvalue() == ""
    assert not QUIET.drawn


@pytest.mark.parametrize("name", ["train.de", "train.de.gz"])
def test_reading_a_file_reports_every_byte_on_disk(tmp_path: Path, name: str) -> None:
    text = "".join(f"Satz Nummer {i}.\n" for i in range(5000)).encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    read: list[int] = []
    lines = sum(len(block) for block in iter_line_blocks(path, 1 << 12, read.append))
    assert lines == 5000 and sum(read) == path.stat().st_size and len(read) > 1


def test_decoding_advances_a_batch_at_a_time_to_the_number_of_sentences() -> None:
    torch.manual_seed(0)
    model = create_model(
        OmegaConf.structured(TransformerConfig(d_model=16, heads=2, d_ff=32, enc_layers=1,
                                               dec_layers=1, max_positions=64)),
        src_vocab_size=40, tgt_vocab_size=40, pad_id=0,
    )  # fmt: skip
    sources = [[5 + i % 30] * (1 + i % 7) for i in range(40)] + [[]]  # the last one empty
    data = TokenDataset(sources, [[] for _ in sources])
    done: list[int] = []
    opts = DecodeOptions(beam=2, max_tokens=60, max_output_len_a=0.0, max_output_len_b=3)
    hyps = decode_dataset(model, data, opts, torch.device("cpu"), advance=done.append)
    assert len(hyps) == 41 and sum(done) == 41 and len([n for n in done if n]) > 2


def test_preparing_draws_a_bar_for_each_pass_over_a_corpus(corpus: Path, tmp_path: Path) -> None:
    cfg = compose_config("train", corpus_overrides(corpus, tmp_path)).data
    out = Terminal()
    ensure_prepared(cfg, progress=Progress(stream=out))
    ends = [part for part in out.getvalue().split("\r") if part.endswith("\n")]
    for stage in ("sample", "encode"):
        (line,) = [e for e in ends if e.startswith(f"{stage} {corpus.name}:")]
        assert "100%|" in line and re.search(r"\| (\S+k)/\1 \[", line), line


# ------------------------------------------------------------- sentencepiece training

DRAWN = re.compile(r"(\d+)/(\d+) \[[^,]*,[^,]*, (.*?)\] *$")  # done/total [times, rate, step]


@pytest.mark.parametrize(
    "model_type, first_sized", [("unigram", "EM round 1:"), ("bpe", "merging")]
)
def test_training_sentencepiece_draws_its_steps_to_an_end_known_early(
    multi30k: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], model_type: str,
    first_sized: str,
) -> None:  # fmt: skip
    lines = read_lines(multi30k / "train.de.gz")[:4000]
    out = Terminal()
    tok = train_tokenizer(lines, tmp_path, vocab_size=1500, model_type=model_type,
                          progress=Progress(stream=out))  # fmt: skip
    assert tok.vocab_size == 1500
    draws = [DRAWN.search(d) for d in out.getvalue().split("\r") if d.strip()]
    steps = [(int(m[1]), int(m[2]), m[3]) for m in draws if m]
    assert len(steps) == len([d for d in out.getvalue().split("\r") if d.strip()])
    done, total, last = steps[-1]
    assert done == total and last == "1,500 pieces" and "100%|" in out.getvalue()
    assert [n for n, _, _ in steps] == sorted(n for n, _, _ in steps) and len(steps) > 5
    # from the first step that knows the sizes (the first EM round, the alphabet), the total
    # is the number of steps the trainer then took
    known = next(i for i, s in enumerate(steps) if s[2].startswith(first_sized))
    assert {t for _, t, _ in steps[known:]} == {total}
    assert steps[-2][0] == total or model_type == "bpe"  # BPE's last hundred merges go unlogged
    err = capfd.readouterr().err
    assert "trainer_interface" not in err and "Loaded all" not in err  # the log went to the bar


def test_off_a_terminal_sentencepiece_draws_nothing_and_logs_no_steps(
    multi30k: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    lines = read_lines(multi30k / "train.en.gz")[:2000]
    out = io.StringIO()
    train_tokenizer(lines, tmp_path, vocab_size=600, progress=Progress(stream=out))
    assert out.getvalue() == ""
    assert "Loaded all" not in capfd.readouterr().err


def test_a_failed_training_gives_standard_error_back(tmp_path: Path) -> None:
    before = os.fstat(2)
    with pytest.raises(DataError, match="vocab_size=5000"):
        train_tokenizer(["ein Hund", "zwei Katzen"] * 50, tmp_path, vocab_size=5000,
                        progress=Progress(stream=Terminal()))  # fmt: skip
    assert os.path.samestat(os.fstat(2), before)


def test_the_trainers_warnings_go_above_the_bar_and_its_information_into_it() -> None:
    class Bar:
        total, n, postfix = 4, 0, ""

        def __init__(self) -> None:
            self.written: list[str] = []

        def write(self, text: str) -> None:
            self.written.append(text)

        def set_postfix_str(self, text: str) -> None:
            self.postfix = text

    bar, steps = Bar(), TrainerSteps("unigram", 8000)
    reader = LogReader(steps, bar)
    for line in [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1796.5 8884 sentencepiece_trainer.cc:149] Starts training with :",
        "trainer_spec {", "  vocab_size: 8000", "}",
        "I0000 00:00:1796.6 8884 trainer_interface.cc:446] Loaded all 58000 sentences",
        "W0000 00:00:1796.7 8884 trainer_interface.cc:123] an odd line was skipped",
        "  and its second line",
        "I0000 00:00:1796.8 8884 unigram_model_trainer.cc:514] Initialized 81998 seed pieces",
        "I0000 00:00:1796.9 8884 unigram_model_trainer.cc:903] EM sub_iter=0 size=24901 obj=10",
        "I0000 00:00:1797.0 8884 unigram_model_trainer.cc:903] EM sub_iter=1 size=21001 obj=8",
        "trainer_interface.cc(409) LOG(ERROR) an older sentencepiece's error",
    ]:  # fmt: skip
        reader.line(line + "\n")
    assert bar.written == [
        "W0000 00:00:1796.7 8884 trainer_interface.cc:123] an odd line was skipped",
        "  and its second line",
        "trainer_interface.cc(409) LOG(ERROR) an older sentencepiece's error",
    ]
    # loaded, (normalized,) seeds, EM round 1; three more rounds: 21001 -> 15750 -> 11812 -> 8859
    assert (bar.n, bar.total) == (4, 7)
    assert bar.postfix == "EM round 1: 21,001 pieces, 8,000 wanted"


# ------------------------------------------------------------- the commands, end to end

BAR = re.compile(r"\r|%\|")  # what a drawn bar writes


@pytest.fixture(scope="module")
def tiny_run(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A transformer trained for a few updates on ``corpus`` (its output is not the point)."""
    from nmt.train.command import train

    root = tmp_path_factory.mktemp("progress")
    overrides = tiny_run_overrides(corpus, root, "trainer.device=cpu", "trainer.max_steps=4")
    train(compose_config("train", overrides), root / "run")
    return root / "run"


def command(module: str, *args: str, terminal: bool, stdin: str = "") -> tuple[str, str]:
    """stdout and stderr of ``python -m module args``: stdout through a pipe, stderr through a
    pipe as well or, with ``terminal``, on a pseudo-terminal (80 columns)."""
    cmd = [sys.executable, "-m", module, *args]
    if not terminal:
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout, proc.stderr
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=side)
    os.close(side)
    drawn: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(main, 1 << 16)
            except OSError:  # the other side closed
                return
            if not chunk:
                return
            drawn.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    out, _ = proc.communicate(stdin.encode(), timeout=300)
    reader.join(timeout=30)
    os.close(main)
    err = b"".join(drawn).decode(errors="replace")
    assert proc.returncode == 0, err[-3000:]
    return out.decode(), err


@pytest.mark.parametrize("terminal", [False, True])
def test_nmt_translate_writes_only_translations_on_stdout(
    tiny_run: Path, corpus: Path, terminal: bool
) -> None:
    lines = Path(f"{corpus}.de").read_text(encoding="utf-8").splitlines()[:30]
    out, err = command(
        "nmt.decode.translate", f"run={tiny_run}", "device=cpu", "beam=1", terminal=terminal,
        stdin="\n".join(lines) + "\n",
    )  # fmt: skip
    assert not BAR.search(out) and out.count("\n") == len(lines)
    if terminal:
        assert "stdin: 100%|" in err and "30/30" in err
    else:
        assert not BAR.search(err)


@pytest.mark.parametrize("terminal", [False, True])
def test_nmt_eval_draws_a_bar_per_test_set_on_a_terminal_only(
    tiny_run: Path, corpus: Path, tmp_path: Path, terminal: bool
) -> None:
    args = [f"run={tiny_run}", "device=cpu", "bootstrap=0", f"out={tmp_path}"]
    out, err = command("nmt.evaluate", *args, terminal=terminal)
    assert not BAR.search(out) and "sentences in" in out
    if terminal:
        assert f"{corpus.name}: 100%|" in err and "120/120" in err
    else:
        assert not BAR.search(err)


@pytest.mark.parametrize("terminal", [False, True])
def test_nmt_prepare_draws_its_passes_on_a_terminal_only(
    corpus: Path, tmp_path: Path, terminal: bool
) -> None:
    out, err = command("nmt.data.prepare", *corpus_overrides(corpus, tmp_path), terminal=terminal)
    assert not BAR.search(out) and Path(out.strip()).is_dir()
    if terminal:
        assert f"sample {corpus.name}: 100%|" in err and f"encode {corpus.name}: 100%|" in err
        assert "sentencepiece: 100%|" in err and "600 pieces]" in err
    else:
        assert not BAR.search(err) and "prepared" in err
    assert "trainer_interface" not in err  # sentencepiece's own log stays out of sight

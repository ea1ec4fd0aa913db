"""The JoeyNMT comparison (benchmarks.joeynmt, joeynmt_setup, joeynmt_run;
scripts/bench_joeynmt.py): the parts that need no JoeyNMT install (preparing its folder, log
parsing, statistics, the checks before a run)."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest
import sentencepiece as spm
import yaml

from benchmarks import joeynmt_run, joeynmt_setup
from nmt.data.corpus import DataError

REPO = Path(__file__).resolve().parents[1]
JOEY_CONFIGS = REPO / "scripts" / "joeynmt"


_STEP = (
    "2026-11-29 13:19:{sec},000 - INFO - joeynmt.training - Epoch   1, Step: {step:8d}, "
    "Batch Loss: 9.0, Batch Acc: 0.0, Tokens per Sec: {rate:8d}, Lr: 0.000010"
)
LOG = "\n".join(
    [
        "2026-11-29 13:19:40,000 - INFO - joeynmt.training - EPOCH 1",
        _STEP.format(sec=42, step=1, rate=800),
        _STEP.format(sec=44, step=2, rate=900),
        _STEP.format(sec=45, step=3, rate=1000),
    ]
)


def test_train_log_windows_after_the_skipped_steps() -> None:
    stats = joeynmt_run.parse_train_log(LOG, logging_freq=1, skip=1)
    assert stats["logged_windows"] == 3 and stats["timed_windows"] == 2
    assert stats["window_tokens_per_s"] == [900.0, 1000.0]
    assert stats["step_seconds"] == [2.0, 1.0]
    with pytest.raises(RuntimeError, match="no window after its first 5 steps"):
        joeynmt_run.parse_train_log(LOG, logging_freq=1, skip=5)
    with pytest.raises(RuntimeError, match="EPOCH 1"):
        joeynmt_run.parse_train_log("nothing logged\n", logging_freq=1, skip=0)


def test_decode_stats_count_eos_as_a_step_up_to_the_cap() -> None:
    stats = joeynmt_run.decode_stats([16, 3, 20], seconds=2.0, cap=17)
    assert stats["sentences"] == 3 and stats["sentences_per_s"] == 1.5
    assert stats["capped_share"] == pytest.approx(2 / 3)  # 16 tokens + EOS, and 20 cut to 17


# ------------------------------------------------------------------------------ JoeyNMT's folder


def _small_multi30k(multi30k: Path, out: Path, lines: dict[str, int]) -> Path:
    """The first lines of real Multi30k splits, gzipped under their Multi30k names."""
    out.mkdir(parents=True)
    for split, n in lines.items():
        for lang in ("de", "en"):
            with gzip.open(multi30k / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                head = [next(f) for _ in range(n)]
            with gzip.open(out / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.writelines(head)
    return out


def _gunzip(path: Path) -> str:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read()


@pytest.fixture
def small_corpus(multi30k: Path, tmp_path: Path) -> Path:
    return _small_multi30k(
        multi30k, tmp_path / "multi30k", {"train": 200, "val": 320, "test_2016_flickr": 20}
    )


def test_joey_data_files_are_the_corpus_lines_and_val300_its_first_300(small_corpus, tmp_path):
    data = tmp_path / "joey" / "data"
    data.mkdir(parents=True)
    (data / "test_2016_flickr.en").write_text("kept as it is\n", encoding="utf-8")
    written = joeynmt_setup.write_joey_data(small_corpus, data)
    assert data / "test_2016_flickr.en" not in written
    assert (data / "test_2016_flickr.en").read_text(encoding="utf-8") == "kept as it is\n"
    assert set(written) == set(joeynmt_setup.joey_data_files(tmp_path / "joey")) - {
        data / "test_2016_flickr.en"
    }
    for lang in ("de", "en"):
        val = _gunzip(small_corpus / f"val.{lang}.gz")
        assert (data / f"val.{lang}").read_text(encoding="utf-8") == val
        val300 = (data / f"val300.{lang}").read_text(encoding="utf-8")
        assert val300.splitlines() == val.splitlines()[:300] and val300.endswith("\n")
        train = _gunzip(small_corpus / f"train.{lang}.gz")
        assert (data / f"train.{lang}").read_text(encoding="utf-8") == train
    assert not list(data.glob(".*"))  # no temporary file left behind


def test_joey_spm_has_joeys_specials_and_a_vocab_of_bare_pieces(small_corpus, tmp_path):
    data = tmp_path / "joey" / "data"
    joeynmt_setup.write_joey_data(small_corpus, data)
    prefix = tmp_path / "joey" / "spm" / "joint"
    joeynmt_setup.train_joey_spm(
        [data / "train.de", data / "train.en"], prefix, threads=1, vocab_size=300
    )
    sp = spm.SentencePieceProcessor(model_file=f"{prefix}.model")
    assert sp.get_piece_size() == 300
    pieces = [sp.id_to_piece(i) for i in range(300)]
    assert pieces[:4] == ["<unk>", "<pad>", "<s>", "</s>"]
    assert (sp.unk_id(), sp.pad_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2, 3)
    # JoeyNMT reads voc_file as one token per line (str.splitlines), index = line number
    vocab = Path(f"{prefix}.vocab").read_text(encoding="utf-8")
    assert vocab.splitlines() == pieces and "\t" not in vocab
    assert any(p.startswith("\u2581") for p in pieces)  # word-initial pieces: text, not bytes
    # the model covers both languages: a German and an English line come back unchanged
    for lang in ("de", "en"):
        line = (data / f"train.{lang}").read_text(encoding="utf-8").splitlines()[0]
        assert sp.decode(sp.encode(line)) == line
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["joint.model", "joint.vocab"]


def test_joey_spm_too_large_a_vocabulary_names_the_inputs(small_corpus, tmp_path):
    data = tmp_path / "data"
    joeynmt_setup.write_joey_data(small_corpus, data)
    with pytest.raises(DataError, match=r"train\.de.*failed"):
        joeynmt_setup.train_joey_spm(
            [data / "train.de"], tmp_path / "spm" / "x", threads=1, vocab_size=8000
        )
    assert not (tmp_path / "spm" / "x.model").exists()


def test_prepare_joey_dir_makes_what_the_repository_configs_name(
    small_corpus, tmp_path, monkeypatch
):
    fetched = []

    def fake_fetch(root, langs, splits, source):
        fetched.append((Path(root), list(langs), list(splits)))
        return small_corpus

    monkeypatch.setattr(joeynmt_setup, "fetch_multi30k", fake_fetch)
    joey = tmp_path / "joey"
    missing = joeynmt_setup.joey_files_missing(joey, JOEY_CONFIGS)
    assert any("spm_joint8k.vocab" in m and "voc_file" in m for m in missing)
    assert any("val300.de" in m and "data.dev" in m for m in missing)
    made = joeynmt_setup.prepare_joey_dir(joey, tmp_path / "data", threads=1, vocab_size=300)
    assert fetched == [(tmp_path / "data", ["de", "en"], ["train", "val", "test_2016_flickr"])]
    assert set(made) == set(joeynmt_setup.joey_data_files(joey)) | set(
        joeynmt_setup.spm_files(joey)
    )
    assert joeynmt_setup.joey_files_missing(joey, JOEY_CONFIGS) == []
    # a complete folder is left alone; a lost .vocab is trained again without fetching
    assert joeynmt_setup.prepare_joey_dir(joey, tmp_path / "data", threads=1, vocab_size=300) == []
    (joey / "spm" / "spm_joint8k.vocab").unlink()
    made = joeynmt_setup.prepare_joey_dir(joey, tmp_path / "data", threads=1, vocab_size=300)
    assert set(made) == set(joeynmt_setup.spm_files(joey)) and len(fetched) == 1


def bench_joeynmt(*args: str) -> subprocess.CompletedProcess:
    """scripts/bench_joeynmt.py with ``args``, as ``make bench-joeynmt`` runs it."""
    cmd = [sys.executable, str(REPO / "scripts" / "bench_joeynmt.py"), *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_repository_configs_are_the_default_and_match_nmt_sizes(tmp_path) -> None:
    result = bench_joeynmt("--help")
    assert result.returncode == 0 and "default scripts/joeynmt" in result.stdout
    tr = yaml.safe_load((JOEY_CONFIGS / "transformer.yaml").read_text())["model"]
    assert (tr["encoder"]["num_layers"], tr["decoder"]["num_layers"]) == (3, 3)
    assert (tr["encoder"]["hidden_size"], tr["encoder"]["ff_size"]) == (256, 1024)
    assert tr["encoder"]["num_heads"] == 4 and tr["tied_embeddings"] and tr["tied_softmax"]
    rnn = yaml.safe_load((JOEY_CONFIGS / "rnn.yaml").read_text())["model"]
    assert rnn["encoder"]["bidirectional"] and rnn["decoder"]["attention"] == "bahdanau"
    assert rnn["encoder"]["hidden_size"] == rnn["decoder"]["hidden_size"] == 512
    assert rnn["encoder"]["embeddings"]["embedding_dim"] == 256


def test_without_joeynmt_the_run_stops_before_preparing_and_says_how_to_install(tmp_path):
    joey = tmp_path / "joey"
    base = ["--joey-dir", str(joey), "--data-root", str(tmp_path / "data")]
    result = bench_joeynmt("--joey-python", str(tmp_path / "nope" / "python"), *base)
    assert result.returncode == 2
    err = result.stderr
    assert "does not exist" in err and "JOEY_PYTHON" in err and "joeynmt==2.3.0" in err
    # a python without joeynmt (nmt's own): named, with the install commands; nothing prepared
    result = bench_joeynmt("--joey-python", sys.executable, *base)
    assert result.returncode == 2
    err = result.stderr
    assert "cannot import joeynmt" in err and "sentencepiece==0.2.0" in err
    assert not (joey / "data").exists() and not (tmp_path / "data").exists()

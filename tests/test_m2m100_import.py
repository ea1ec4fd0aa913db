"""Importing an M2M100ForConditionalGeneration folder made by transformers itself (small,
random, with its own sentencepiece model and M2M100Tokenizer's vocab.json, or NllbTokenizer's
tokenizer.json): our tokenizer gives its ids with the language codes where it puts them, the
teacher-forced log-probabilities are transformers', and the imported run translates, scores
and fine-tunes any pair of its languages as generate() with ``forced_bos_token_id`` does."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from nmt.config import ConfigError
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from nmt.ship.import_command import main as import_main
from nmt.store.checkpoint import load_checkpoint
from nmt.store.m2m100_import import M2M100_LANGUAGES, import_m2m100

from .m2m100_folders import NLLB_LANGS, fine_tune_args, make_m2m100, make_nllb

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.usefixtures("one_thread")]

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def m2m100(threeway: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_m2m100(threeway, tmp_path_factory.mktemp("m2m100"))


def hf_tokenizer(folder: Path, src: str, tgt: str):
    return transformers.M2M100Tokenizer.from_pretrained(str(folder), src_lang=src, tgt_lang=tgt)


@pytest.fixture(scope="module")
def imported(m2m100: Path):
    return import_m2m100(m2m100)


def sentences(threeway: Path, lang: str) -> list[str]:
    lines = Path(f"{threeway}.{lang}").read_text(encoding="utf-8").splitlines()[-5:]
    return [*lines, "Ein Zebra – 3½ Äpfel!"]


def test_our_tokenizer_gives_its_ids_with_the_source_language_first(m2m100, imported, threeway):
    tok, rows = imported.tokenizers.src, imported.vocab.src_rows
    for lang in ("de", "fr"):
        src = sentences(threeway, lang)
        theirs = hf_tokenizer(m2m100, lang, "en")(src)["input_ids"]
        ours = [[tok.tags[lang], *tok.encode(line), EOS_ID] for line in src]
        assert [[rows[i] for i in row] for row in ours] == theirs
    assert sorted(tok.tags) == sorted(M2M100_LANGUAGES)
    unk = 3  # their <unk>: the pieces vocab.json lacks
    assert any(unk in row for row in theirs)


def test_teacher_forced_log_probabilities_are_transformers(m2m100, imported, threeway) -> None:
    hf = transformers.M2M100ForConditionalGeneration.from_pretrained(str(m2m100)).eval()
    model = copy.deepcopy(imported.model).double()
    hf = hf.double()
    tok = imported.tokenizers.src
    src = sentences(threeway, "de")
    refs = sentences(threeway, "en")
    src_ids = [[tok.tags["de"], *tok.encode(s), EOS_ID] for s in src]
    tgt_ids = [[BOS_ID, tok.tags["en"], *tok.encode(r)] for r in refs]
    s_len, t_len = max(map(len, src_ids)), max(map(len, tgt_ids))
    src_t = torch.tensor([s + [PAD_ID] * (s_len - len(s)) for s in src_ids])
    tgt_t = torch.tensor([t + [PAD_ID] * (t_len - len(t)) for t in tgt_ids])
    lens = torch.tensor([len(s) for s in src_ids])
    with torch.inference_mode():
        ours = model(src_t, lens, tgt_t).log_softmax(-1)  # (B, T, V')
    rows = torch.tensor(imported.vocab.src_rows)
    theirs_pad = 1
    mask = torch.arange(s_len)[None] < lens[:, None]
    src_theirs = torch.where(mask, rows[src_t], theirs_pad)
    with torch.inference_mode():
        tgt_theirs = torch.where(tgt_t == PAD_ID, theirs_pad, rows[tgt_t])
        out = hf(input_ids=src_theirs, attention_mask=mask.long(), decoder_input_ids=tgt_theirs)
    theirs = out.logits.log_softmax(-1)  # (B, T, V)
    # each of their classes is one of ours; ours never output are PAD, BOS, the unread pieces
    never = set(imported.vocab.never)
    classes = [i for i in range(len(rows)) if i not in never]
    assert sorted(rows[classes].tolist()) == list(range(theirs.size(-1)))
    real = torch.arange(t_len)[None] < torch.tensor([len(t) for t in tgt_ids])[:, None]
    gap = (ours[..., classes] - theirs[..., rows[classes]]).abs()[real].max()
    assert gap < 1e-6, gap
    assert ours[..., sorted(never)].max() < -1e3  # no probability for what they cannot output


@pytest.fixture(scope="module")
def run(m2m100: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imported") / "run"
    assert import_main([str(m2m100), "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize(("src_lang", "tgt_lang"), [("de", "en"), ("en", "fr"), ("fr", "de")])
def test_the_run_translates_any_pair_as_transformers_does(m2m100, imported, run, threeway,
                                                          src_lang, tgt_lang) -> None:  # fmt: skip
    """The same tokens as generate() with the target's code forced, and the same text where
    transformers' tokenizer drops what ours does (their special tokens and language codes)."""
    from nmt.decode.engines import TorchEngine
    from nmt.decode.languages import choose_target, decode_ids_into
    from nmt.decode.options import DecodeOptions
    from nmt.decode.translate import translate_lines
    from nmt.store.loading import load_trained
    from nmt.store.paths import checkpoint_path

    trained = load_trained(checkpoint_path(run), CPU)
    assert trained.cfg.data.tag_placement == "both"
    target = choose_target(trained.cfg, trained.tokenizers, tgt_lang, src_lang)
    src = sentences(threeway, src_lang)
    opts = DecodeOptions(beam=1, max_output_len_a=0.0, max_output_len_b=10)
    sources = trained.tokenizers.src.encode_batch(src)
    hyps = decode_ids_into(TorchEngine(trained.model, CPU), sources, target, opts)
    hf = transformers.M2M100ForConditionalGeneration.from_pretrained(str(m2m100)).eval()
    tok = hf_tokenizer(m2m100, src_lang, tgt_lang)
    batch = tok(src, return_tensors="pt", padding=True)
    forced = tok.get_lang_id(tgt_lang)
    with torch.inference_mode():
        out = hf.generate(**batch, forced_bos_token_id=forced, num_beams=1, do_sample=False,
                          max_new_tokens=11)  # fmt: skip
    rows = imported.vocab.src_rows
    for hyp, row in zip(hyps, out.tolist(), strict=True):
        assert row[:2] == [2, forced]  # the decoder's start, then the forced code
        body = row[2 : row.index(2, 2)] if 2 in row[2:] else row[2:]
        assert [rows[t] for t in hyp.tokens] == body
    codes = {tok.get_lang_id(lang) for lang in M2M100_LANGUAGES}
    kept = [[t for t in row if t not in codes] for row in out.tolist()]
    texts = [r[0][0] for r in translate_lines(trained, src, opts, CPU, target=target)]
    assert texts == tok.batch_decode(kept, skip_special_tokens=True)


def test_the_run_needs_the_source_language(run) -> None:
    from nmt.data.corpus import DataError
    from nmt.decode.languages import choose_target
    from nmt.store.loading import load_trained
    from nmt.store.paths import checkpoint_path

    trained = load_trained(checkpoint_path(run), CPU)
    with pytest.raises(DataError, match="name the source language with src_lang"):
        choose_target(trained.cfg, trained.tokenizers, "en")


def test_the_run_scores_and_fine_tunes_one_direction(run, threeway, tmp_path) -> None:
    from nmt.evaluate.scoring import evaluate
    from nmt.store.checkpoint import load_checkpoint
    from nmt.train.command import train

    from .helpers import compose_config

    fields = load_checkpoint(run / "checkpoints" / "best.pt")["config"]["model"]
    overrides = [
        *fine_tune_args(threeway, tmp_path, str(run), 3, "[de-en,en-fr]"),
        "data.tag_placement=both", *(f"model.{k}={v}" for k, v in fields.items() if k != "arch"),
    ]  # fmt: skip
    result = train(compose_config("train", overrides), tmp_path / "tuned")
    assert result["state"]["step"] == 3
    args = [f"run={tmp_path / 'tuned'}", "max_output_len_a=0", "max_output_len_b=5",
            "off_target=false"]  # fmt: skip
    report = evaluate(compose_config("eval", args))
    assert {"de-en", "en-fr"} <= {e["direction"] for e in report["directions"].values()}


def test_a_foreign_language_list_is_refused_by_name(m2m100, tmp_path) -> None:
    import shutil

    folder = tmp_path / "wmt21"
    shutil.copytree(m2m100, folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg | {"language_codes": "wmt21"}))
    with pytest.raises(ConfigError, match="language_codes='wmt21' is not read"):
        import_m2m100(folder)


# ------------------------------------------------------------------------------------ NLLB


@pytest.fixture(scope="module")
def nllb(m2m100: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_nllb(m2m100, tmp_path_factory.mktemp("nllb"), tmp_path_factory.mktemp("spm"))


def nllb_tokenizer(folder: Path, src: str, tgt: str):
    return transformers.AutoTokenizer.from_pretrained(str(folder), src_lang=src, tgt_lang=tgt)


def test_nllb_ids_and_log_probabilities_are_transformers(nllb, threeway) -> None:
    imported = import_m2m100(nllb)
    langs = imported.vocab.languages
    # named by ISO 639-1 where a language has one no other shares, else by NLLB's code
    assert len(langs) == 202 and {"de", "en", "fr", "cs", "arb_Arab", "zho_Hans"} <= set(langs)
    assert "deu_Latn" not in langs and "zh" not in langs
    tok, rows = imported.tokenizers.src, torch.tensor(imported.vocab.src_rows)
    src = sentences(threeway, "de")
    refs = sentences(threeway, "en")
    theirs_ids = nllb_tokenizer(nllb, "deu_Latn", "eng_Latn")(src)["input_ids"]
    src_ids = [[tok.tags["de"], *tok.encode(s), EOS_ID] for s in src]
    assert [rows[row].tolist() for row in src_ids] == theirs_ids
    tgt_ids = [[BOS_ID, tok.tags["en"], *tok.encode(r)] for r in refs]
    s_len, t_len = max(map(len, src_ids)), max(map(len, tgt_ids))
    src_t = torch.tensor([s + [PAD_ID] * (s_len - len(s)) for s in src_ids])
    tgt_t = torch.tensor([t + [PAD_ID] * (t_len - len(t)) for t in tgt_ids])
    lens = torch.tensor([len(s) for s in src_ids])
    hf = transformers.M2M100ForConditionalGeneration.from_pretrained(str(nllb)).eval().double()
    with torch.inference_mode():
        ours = copy.deepcopy(imported.model).double()(src_t, lens, tgt_t).log_softmax(-1)
        mask = torch.arange(s_len)[None] < lens[:, None]
        out = hf(input_ids=torch.where(mask, rows[src_t], 1), attention_mask=mask.long(),
                 decoder_input_ids=torch.where(tgt_t == PAD_ID, 1, rows[tgt_t]))  # fmt: skip
    theirs = out.logits.log_softmax(-1)
    never = set(imported.vocab.never)
    classes = [i for i in range(len(rows)) if i not in never]
    assert sorted(rows[classes].tolist()) == list(range(theirs.size(-1)))
    real = torch.arange(t_len)[None] < torch.tensor([len(t) for t in tgt_ids])[:, None]
    assert (ours[..., classes] - theirs[..., rows[classes]]).abs()[real].max() < 1e-6


def test_an_imported_nllb_run_translates_as_transformers_does(nllb, threeway, tmp_path) -> None:
    from nmt.decode.engines import TorchEngine
    from nmt.decode.languages import choose_target, decode_ids_into
    from nmt.decode.options import DecodeOptions
    from nmt.store.loading import load_trained
    from nmt.store.paths import checkpoint_path

    assert import_main([str(nllb), "--out", str(tmp_path / "run")]) == 0
    trained = load_trained(checkpoint_path(tmp_path / "run"), CPU)
    rows = import_m2m100(nllb).vocab.src_rows
    hf = transformers.M2M100ForConditionalGeneration.from_pretrained(str(nllb)).eval()
    opts = DecodeOptions(beam=1, max_output_len_a=0.0, max_output_len_b=10)
    for src_lang, tgt_lang in (("de", "fr"), ("en", "de")):
        target = choose_target(trained.cfg, trained.tokenizers, tgt_lang, src_lang)
        src = sentences(threeway, src_lang)
        sources = trained.tokenizers.src.encode_batch(src)
        hyps = decode_ids_into(TorchEngine(trained.model, CPU), sources, target, opts)
        tok = nllb_tokenizer(nllb, NLLB_LANGS[src_lang], NLLB_LANGS[tgt_lang])
        forced = tok.convert_tokens_to_ids(NLLB_LANGS[tgt_lang])
        with torch.inference_mode():
            out = hf.generate(**tok(src, return_tensors="pt", padding=True),
                              forced_bos_token_id=forced, num_beams=1, do_sample=False,
                              max_new_tokens=11)  # fmt: skip
        for hyp, row in zip(hyps, out.tolist(), strict=True):
            assert row[:2] == [2, forced]
            body = row[2 : row.index(2, 2)] if 2 in row[2:] else row[2:]
            assert [rows[t] for t in hyp.tokens] == body


def test_the_run_exports_for_ctranslate2_which_decodes_as_our_search(run, threeway, tmp_path):
    """The imported run's CTranslate2 package reads each source with its language's code and
    forces the target's: the same greedy tokens as our search (and scores, where they end
    before the cap)."""
    pytest.importorskip("ctranslate2")
    from nmt.decode.engines import TorchEngine, make_ct2_engine
    from nmt.decode.languages import choose_target, decode_ids_into
    from nmt.decode.options import DecodeOptions
    from nmt.ship.export import export_package
    from nmt.store.loading import load_package

    package = export_package(run / "checkpoints" / "best.pt", tmp_path / "pkg",
                             fmt="ctranslate2", quantize="float32")  # fmt: skip
    loaded = load_package(package, CPU)
    opts = DecodeOptions(beam=1, max_output_len_a=0.0, max_output_len_b=10)
    ours_engine, ct2_engine = TorchEngine(loaded.model, CPU), make_ct2_engine(loaded, CPU)
    for src_lang, tgt_lang in (("de", "fr"), ("en", "de")):
        target = choose_target(loaded.cfg, loaded.tokenizers, tgt_lang, src_lang)
        sources = loaded.tokenizers.src.encode_batch(sentences(threeway, src_lang))
        ours = decode_ids_into(ours_engine, sources, target, opts)
        theirs = decode_ids_into(ct2_engine, sources, target, opts)
        assert [h.tokens for h in theirs] == [h.tokens for h in ours]
        # at the cap our search adds the closing EOS's log-probability, CTranslate2 does not
        # (nmt.decode.ct2): the scores of outputs that end before it are the same
        ended = [(a, b) for a, b in zip(ours, theirs, strict=True) if len(a.tokens) < 10]
        assert all(abs(a.score - b.score) < 1e-3 for a, b in ended)


def test_an_imported_nllb_run_fine_tunes_on_files_named_by_iso_codes(nllb, threeway, tmp_path):
    """Multi30k's .de and .en files reach NLLB's deu_Latn and eng_Latn: the run names them de
    and en; only trainer.init_from and the data are given (the architecture comes with it)."""
    from nmt.train.command import train

    from .helpers import compose_config

    run = tmp_path / "nllb"
    assert import_main([str(nllb), "--out", str(run)]) == 0
    overrides = fine_tune_args(threeway, tmp_path, str(run), 2)
    result = train(compose_config("train", overrides), tmp_path / "tuned", overrides)
    assert result["state"]["step"] == 2
    saved = load_checkpoint(tmp_path / "tuned" / "checkpoints" / "last.pt")
    assert saved["config"]["data"]["tag_placement"] == "both"
    assert saved["config"]["model"]["position_style"] == "fairseq"


def test_the_run_serves_any_pair_and_asks_for_the_source(run, threeway) -> None:
    """nmt-serve on the imported run: /languages lists its 100 languages, each into the 99
    others; a request is translated as our search translates that pair, and one that names no
    source is refused (its sources start with their language's code)."""
    pytest.importorskip("aiohttp")
    from aiohttp.test_utils import TestClient

    from nmt.decode.languages import choose_target
    from nmt.decode.options import DecodeOptions
    from nmt.decode.translate import translate_lines
    from nmt.serve.app import make_app
    from nmt.serve.backend import load_backend
    from nmt.store.loading import load_trained
    from nmt.store.paths import checkpoint_path

    from .helpers import compose_config
    from .serving import run_app

    cfg = compose_config("serve", [f"run={run}", "engine=torch", "device=cpu", "threads=1"])
    trained = load_trained(checkpoint_path(run), CPU)
    src = sentences(threeway, "de")[:3]
    target = choose_target(trained.cfg, trained.tokenizers, "fr", "de")
    opts = DecodeOptions(beam=1)
    expected = [r[0][0] for r in translate_lines(trained, src, opts, CPU, target=target)]

    async def scenario(client: TestClient) -> None:
        listed = await (await client.get("/languages")).json()
        assert len(listed) == 100
        assert all(len(lang["targets"]) == 99 for lang in listed)
        body = {"text": src, "source": "de", "target": "fr", "beam": 1}
        response = await client.post("/v1/translate", json=body)
        assert response.status == 200, await response.text()
        assert (await response.json())["translations"] == expected
        response = await client.post("/v1/translate", json={"text": src, "target": "fr"})
        error = (await response.json())["error"]
        assert response.status == 400 and "'source' is missing" in error
        libre = {"q": src[0], "source": "de", "target": "fr"}
        response = await client.post("/translate", json=libre)
        assert response.status == 200, await response.text()
        assert (await response.json())["translatedText"] == expected[0]

    run_app(make_app(load_backend(cfg), cfg), scenario)


def test_init_from_hf_imports_the_folder_once_and_fine_tunes(m2m100, threeway, tmp_path,
                                                            monkeypatch) -> None:  # fmt: skip
    """trainer.init_from=hf:FOLDER imports the model under <outputs>/imported/ and starts from
    it; a second run reuses that import; a Hub id without the network is refused by name."""
    from nmt.config import ConfigError
    from nmt.train.command import train

    from .helpers import compose_config

    def overrides(init_from: str) -> list[str]:
        return fine_tune_args(threeway, tmp_path, init_from, 1)

    args = overrides(f"hf:{m2m100}")
    result = train(compose_config("train", args), tmp_path / "a", args)
    imported = list((tmp_path / "outputs" / "imported").iterdir())
    assert len(imported) == 1
    best = imported[0] / "checkpoints" / "best.pt"
    assert result["state"]["init_from"]["checkpoint"] == str(best.resolve())
    stamp = best.stat().st_mtime_ns
    args = overrides(f"hf:{m2m100}")
    train(compose_config("train", args), tmp_path / "b", args)
    assert best.stat().st_mtime_ns == stamp  # imported once
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = overrides("hf:facebook/m2m100_xx")
    with pytest.raises(ConfigError, match="facebook/m2m100_xx"):
        train(compose_config("train", args), tmp_path / "c", args)
    assert not (tmp_path / "c").exists()

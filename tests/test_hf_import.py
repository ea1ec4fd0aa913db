"""Importing a MarianMTModel folder made by transformers itself (small, random, with its own
sentencepiece models and vocab.json): our tokenizers give Marian's ids, the teacher-forced
log-probabilities are transformers', greedy search outputs what generate() does, and hostile
or foreign folders are refused by name."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch

from benchmarks.hf_trainer import pieces, spm_model
from nmt.config import ConfigError
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from nmt.decode.search import greedy_search
from nmt.ship.import_command import main as import_main
from nmt.store.hf_import import NEVER, import_marian

from .helpers import saved_random_model

transformers = pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses:UserWarning"),
]

DROPPED = 3  # source pieces left out of vocab.json: Marian reads them as <unk>


@pytest.fixture(scope="module")
def marian(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random MarianMTModel (swish, a non-zero output bias, post-norm) with its tokenizer."""
    return make_marian(corpus, tmp_path_factory.mktemp("marian"), DROPPED)


def make_marian(corpus: Path, folder: Path, dropped: int) -> Path:
    """The folder of :func:`marian`, its vocab.json without the last ``dropped`` source
    pieces."""
    de = Path(f"{corpus}.de").read_text(encoding="utf-8").splitlines()
    en = Path(f"{corpus}.en").read_text(encoding="utf-8").splitlines()
    source, target = spm_model(de, 150), spm_model(en, 120)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    src_pieces = pieces(source)
    kept = src_pieces[: len(src_pieces) - dropped] + [
        p for p in pieces(target) if p not in src_pieces
    ]
    vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(dict.fromkeys(kept))}}
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "de", "target_lang": "en", "model_max_length": 64}),
        encoding="utf-8",
    )
    config = transformers.MarianConfig(
        vocab_size=len(vocab), d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, activation_function="swish", max_position_embeddings=256,
        pad_token_id=vocab["<pad>"], eos_token_id=0, decoder_start_token_id=vocab["<pad>"],
        forced_eos_token_id=0, scale_embedding=True, dropout=0.1,
    )  # fmt: skip
    saved_random_model(transformers.MarianMTModel, config, folder, seed=0, output_bias=True)
    return folder


def hf_tokenizer(folder: Path):
    return transformers.MarianTokenizer.from_pretrained(str(folder))


def sentences(corpus: Path, n: int = 6) -> tuple[list[str], list[str]]:
    de = Path(f"{corpus}.de").read_text(encoding="utf-8").splitlines()[-n:]
    en = Path(f"{corpus}.en").read_text(encoding="utf-8").splitlines()[-n:]
    return de + ["Ein Zebra – 3½ Äpfel!"], en + ["A zebra."]


@pytest.fixture(scope="module")
def imported(marian: Path):
    return import_marian(marian)


def test_our_tokenizers_give_marians_ids(marian, imported, corpus) -> None:
    src, _ = sentences(corpus)
    rows = imported.vocab.src_rows
    theirs = hf_tokenizer(marian)(src)["input_ids"]
    ours = [[rows[i] for i in imported.tokenizers.src.encode(line)] + [0] for line in src]
    assert ours == theirs
    unk = json.loads((marian / "vocab.json").read_text())["<unk>"]
    assert any(unk in row for row in ours)  # the dropped pieces read as Marian's <unk>


def teacher_forced(tok, src: list[str], refs: list[str]) -> tuple[torch.Tensor, ...]:
    """Our padded source and decoder-input ids of ``src`` and ``refs``, the source lengths,
    and the masks of real source and target positions."""
    src_ids = [tok.src.encode(s) + [EOS_ID] for s in src]
    tgt_ids = [[BOS_ID, *tok.tgt.encode(r)] for r in refs]
    s_len, t_len = max(map(len, src_ids)), max(map(len, tgt_ids))
    src_t = torch.tensor([s + [PAD_ID] * (s_len - len(s)) for s in src_ids])
    tgt_t = torch.tensor([t + [PAD_ID] * (t_len - len(t)) for t in tgt_ids])
    lens = torch.tensor([len(s) for s in src_ids])
    mask = torch.arange(s_len)[None] < lens[:, None]
    real = torch.arange(t_len)[None] < torch.tensor([len(t) for t in tgt_ids])[:, None]
    return src_t, tgt_t, lens, mask, real


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_teacher_forced_log_probabilities_are_transformers(marian, imported, corpus, dtype) -> None:
    """Equal to rounding: 1e-4 in fp32 (weights large enough to vary the outputs make logits
    of several units), 1e-5 in fp64 (where both sides' sinusoid tables still hold the fp32
    values each computes its own way)."""
    hf = transformers.MarianMTModel.from_pretrained(str(marian)).eval().to(dtype)
    model = copy.deepcopy(imported.model).to(dtype)
    src_t, tgt_t, lens, mask, real = teacher_forced(imported.tokenizers, *sentences(corpus))
    with torch.inference_mode():
        ours = model(src_t, lens, tgt_t).log_softmax(-1)  # (B, T, V')
    src_rows, tgt_rows = (
        torch.tensor(imported.vocab.src_rows),
        torch.tensor(imported.vocab.tgt_rows),
    )
    with torch.inference_mode():
        out = hf(input_ids=src_rows[src_t], attention_mask=mask.long(),
                 decoder_input_ids=tgt_rows[tgt_t])  # fmt: skip
    theirs = out.logits.log_softmax(-1)  # (B, T, V)
    gap = (ours[..., 1:] - theirs[..., tgt_rows[1:]]).abs()[real].max()
    assert gap < (1e-4 if dtype == torch.float32 else 1e-5), gap
    assert ours[..., PAD_ID].max() < NEVER / 2  # our PAD is no class


def test_greedy_search_outputs_what_generate_does(marian, imported, corpus) -> None:
    hf = transformers.MarianMTModel.from_pretrained(str(marian)).eval()
    src, _ = sentences(corpus)
    tok, rows = imported.tokenizers, imported.vocab.tgt_rows
    src_ids = [tok.src.encode(s) + [EOS_ID] for s in src]
    s_len = max(map(len, src_ids))
    src_t = torch.tensor([s + [PAD_ID] * (s_len - len(s)) for s in src_ids])
    lens = torch.tensor([len(s) for s in src_ids])
    cap = 10
    hyps = greedy_search(imported.model, src_t, lens, torch.full((len(src),), cap), BOS_ID,
                         EOS_ID)  # fmt: skip
    mask = torch.arange(s_len)[None] < lens[:, None]
    with torch.inference_mode():
        out = hf.generate(input_ids=torch.tensor(imported.vocab.src_rows)[src_t],
                          attention_mask=mask.long(), num_beams=1, do_sample=False,
                          max_new_tokens=cap + 1, bad_words_ids=None, output_logits=True,
                          return_dict_in_generate=True)  # fmt: skip
    pad = hf.config.pad_token_id
    steps = torch.stack(out.logits, dim=1).log_softmax(-1)  # (B, steps, V)
    for b, (hyp, row) in enumerate(zip(hyps, out.sequences.tolist(), strict=True)):
        assert row[0] == pad  # the decoder's start
        body = row[1 : row.index(0)] if 0 in row[1:] else row[1:]
        assert [rows[t] for t in hyp.tokens] == body
        chosen = row[1 : len(body) + 2]  # the tokens and the EOS, where it came
        score = steps[b, torch.arange(len(chosen)), torch.tensor(chosen)].sum()
        assert hyp.score == pytest.approx(float(score), abs=1e-4)  # the same path, step by step


# ---------------------------------------------------------------------------- refused folders


def altered(marian: Path, tmp_path: Path, **config) -> Path:
    folder = tmp_path / "altered"
    shutil.copytree(marian, folder)
    data = json.loads((folder / "config.json").read_text())
    data.update(config)
    (folder / "config.json").write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"auto_map": {"AutoModel": "evil.Model"}}, "asks for remote code"),
        ({"model_type": "nllb-moe", "architectures": ["NllbMoeForConditionalGeneration"]},
         "architecture 'NllbMoeForConditionalGeneration' is not read"),
        ({"model_type": "m2m_100", "architectures": ["M2M100ForConditionalGeneration"]},
         "m2m_100 is not a MarianMTModel"),
        ({"activation_function": "tanh"}, "activation_function='tanh'"),
        ({"d_model": "16"}, "d_model='16' is not a int"),
        ({"vocab_size": 7}, "vocab_size=7"),
    ],
)  # fmt: skip
def test_a_config_we_cannot_read_is_refused_by_name(marian, tmp_path, change, message) -> None:
    with pytest.raises(ConfigError, match=message):
        import_marian(altered(marian, tmp_path, **change))


def test_a_tensor_we_cannot_read_is_refused_by_name(marian, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    folder = altered(marian, tmp_path)
    weights = load_file(str(folder / "model.safetensors"))
    bad = dict(weights)
    bad["model.encoder.layers.0.fc1.weight"] = bad["model.encoder.layers.0.fc1.weight"] * float(
        "nan"
    )
    save_file(bad, str(folder / "model.safetensors"))
    with pytest.raises(ConfigError, match="model.encoder.layers.0.fc1.weight holds values"):
        import_marian(folder)
    bad = {k: v for k, v in weights.items() if k != "model.decoder.layers.1.fc2.bias"}
    save_file(bad, str(folder / "model.safetensors"))
    with pytest.raises(ConfigError, match="missing tensor model.decoder.layers.1.fc2.bias"):
        import_marian(folder)
    save_file({**weights, "model.extra.weight": torch.zeros(2)}, str(folder / "model.safetensors"))
    with pytest.raises(ConfigError, match="unexpected tensor model.extra.weight"):
        import_marian(folder)
    small = dict(weights)
    small["model.encoder.layers.0.fc1.weight"] = torch.zeros(8, 16)
    save_file(small, str(folder / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"model.encoder.layers.0.fc1.weight is \(8, 16\)"):
        import_marian(folder)


def test_a_pickled_weights_file_is_read_without_running_code(marian, tmp_path) -> None:
    folder = altered(marian, tmp_path)
    (folder / "model.safetensors").unlink()

    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    torch.save({"x": Evil()}, folder / "pytorch_model.bin")
    with pytest.raises(ConfigError, match="pytorch_model.bin cannot be read safely"):
        import_marian(folder)


# ----------------------------------------------------------------------- nmt-import, the run


@pytest.fixture(scope="module")
def run(marian: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imported") / "run"
    assert import_main([str(marian), "--out", str(out)]) == 0
    return out


def test_the_run_translates_as_transformers_does(marian, run, corpus) -> None:
    from nmt.decode.options import DecodeOptions
    from nmt.decode.translate import translate_lines
    from nmt.store.loading import load_trained
    from nmt.store.paths import checkpoint_path

    trained = load_trained(checkpoint_path(run), torch.device("cpu"))
    assert (trained.cfg.data.src_lang, trained.cfg.data.tgt_lang) == ("de", "en")
    src, _ = sentences(corpus)
    opts = DecodeOptions(beam=1, max_output_len_a=0.0, max_output_len_b=10)
    ours = [r[0][0] for r in translate_lines(trained, src, opts, torch.device("cpu"))]
    hf = transformers.MarianMTModel.from_pretrained(str(marian)).eval()
    tok = hf_tokenizer(marian)
    batch = tok(src, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = hf.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=11,
                          bad_words_ids=None)  # fmt: skip
    assert ours == tok.batch_decode(out, skip_special_tokens=True)


def test_the_run_scores_and_fine_tunes(run, corpus, tmp_path) -> None:
    from nmt.evaluate.scoring import evaluate
    from nmt.store.checkpoint import load_checkpoint
    from nmt.train.command import train

    from .helpers import QUIET_TINY_RUN, compose_config, corpus_overrides

    short = ["max_output_len_a=0", "max_output_len_b=5"]
    report = evaluate(compose_config("eval", [f"run={run}", f"test=[{corpus}.de:{corpus}.en]",
                                             *short]))  # fmt: skip
    assert "BLEU" in next(iter(report["sets"].values()))["scores"]
    fields = load_checkpoint(run / "checkpoints" / "best.pt")["config"]["model"]
    overrides = [
        *corpus_overrides(corpus, tmp_path), f"outputs={tmp_path / 'outputs'}",
        f"trainer.init_from={run}", "trainer.max_steps=3", "trainer.val_every=3",
        "trainer.val_sentences=4", *QUIET_TINY_RUN,
        *(f"model.{k}={v}" for k, v in fields.items() if k != "arch"),
    ]  # fmt: skip
    result = train(compose_config("train", overrides), tmp_path / "tuned")
    assert result["state"]["step"] == 3
    assert result["state"]["init_from"]["checkpoint"].endswith("best.pt")


def test_a_run_is_written_whole_or_not_at_all(marian, tmp_path, monkeypatch) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "file").write_text("x")
    with pytest.raises(SystemExit) as e:
        import_main([str(marian), "--out", str(busy)])
    assert e.value.code == 2 and (busy / "file").read_text() == "x"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit) as e:
        import_main(["Helsinki-NLP/opus-mt-xx-yy", "--out", str(tmp_path / "hub")])
    assert e.value.code == 2 and not (tmp_path / "hub").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]  # no half-written run


def test_the_run_exports_for_ctranslate2_which_decodes_as_our_search(run, corpus, tmp_path) -> None:
    """The imported run's CTranslate2 package (its output bias and activation included) gives
    our greedy tokens and scores."""
    pytest.importorskip("ctranslate2")
    from nmt.data.datasets import encode_texts
    from nmt.decode.engines import TorchEngine, make_engine
    from nmt.decode.options import DecodeOptions
    from nmt.ship.export import export_package
    from nmt.store.loading import load_package

    package = export_package(run / "checkpoints" / "best.pt", tmp_path / "pkg",
                             fmt="ctranslate2", quantize="float32")  # fmt: skip
    cpu = torch.device("cpu")
    loaded = load_package(package, cpu)
    src, refs = sentences(corpus)
    data = encode_texts(loaded.tokenizers, src, refs)
    opts = DecodeOptions(beam=1, max_output_len_a=0.0, max_output_len_b=10)
    ours = TorchEngine(loaded.model, cpu).hypotheses(data, opts)
    theirs = make_engine("ctranslate2", loaded, opts, cpu).hypotheses(data, opts)
    assert [h.tokens for h in ours] == [h.tokens for h in theirs]
    assert max(abs(a.score - b.score) for a, b in zip(ours, theirs, strict=True)) < 1e-3


def test_the_run_serves_through_libretranslates_api(run, corpus, tmp_path) -> None:
    """nmt-serve on the imported run's CTranslate2 package answers LibreTranslate's /translate
    with what nmt-translate's function gives."""
    pytest.importorskip("ctranslate2")
    from nmt.decode.options import DecodeOptions
    from nmt.decode.translate import translate_lines
    from nmt.serve.app import make_app
    from nmt.serve.backend import load_backend
    from nmt.ship.export import export_package
    from nmt.store.loading import load_trained
    from nmt.store.paths import checkpoint_path

    from .serving import run_app, serve_config

    package = export_package(run / "checkpoints" / "best.pt", tmp_path / "pkg",
                             fmt="ctranslate2", quantize="float32")  # fmt: skip
    extra = ("engine=ctranslate2", "beam=1", "max_output_len_a=0", "max_output_len_b=10")
    app = make_app(load_backend(serve_config(package, *extra)), serve_config(package, *extra))
    src, _ = sentences(corpus, 3)
    trained = load_trained(checkpoint_path(run), torch.device("cpu"))
    opts = DecodeOptions(beam=1, max_output_len_a=0.0, max_output_len_b=10)
    want = [r[0][0] for r in translate_lines(trained, src, opts, torch.device("cpu"))]

    async def scenario(client) -> None:
        response = await client.post("/translate", json={"q": src, "source": "de", "target": "en"})
        assert response.status == 200, await response.text()
        assert (await response.json())["translatedText"] == want
        languages = await (await client.get("/languages")).json()
        assert {lang["code"] for lang in languages} == {"de", "en"}

    run_app(app, scenario)


def test_an_embedding_of_another_vocabulary_size_is_refused_by_name(marian, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    folder = altered(marian, tmp_path)
    weights = load_file(str(folder / "model.safetensors"))
    name = next(n for n in ("model.shared.weight", "lm_head.weight") if n in weights)
    save_file({**weights, name: weights[name][:-5]}, str(folder / "model.safetensors"))
    with pytest.raises(ConfigError, match=f"weights: {name} is .* rows of the vocabulary"):
        import_marian(folder)


def test_nmt_import_refuses_remote_code_in_one_line_and_writes_nothing(marian, tmp_path) -> None:
    import subprocess
    import sys

    from .helpers import REPO

    folder = altered(marian, tmp_path, auto_map={"AutoModelForSeq2SeqLM": "evil.Model"})
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "nmt.ship.import_command", str(folder), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "asks for remote code (auto_map); nothing is run" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["altered"]


def test_the_run_exports_back_to_the_original_tensors(marian, imported, run, tmp_path) -> None:
    """nmt-export --format hf of the imported run gives back the folder's tensors: every one
    as it was, those of the vocabulary row by row in our order (our PAD, a class Marian lacks,
    aside)."""
    from safetensors.torch import load_file

    from nmt.ship.export import main as export_main

    out = tmp_path / "hf"
    assert export_main([str(run), "--out", str(out), "--format", "hf"]) == 0
    original = load_file(str(marian / "model.safetensors"))
    exported = load_file(str(out / "model.safetensors"))
    rows = torch.tensor(imported.vocab.tgt_rows)
    kept = torch.arange(1, len(rows))  # our ids but PAD
    vocabulary = {"model.shared.weight", "model.encoder.embed_tokens.weight",
                  "model.decoder.embed_tokens.weight", "lm_head.weight"}  # fmt: skip
    compared = 0
    for name, theirs in original.items():
        if name not in exported or ".embed_positions." in name:
            continue
        mine = exported[name]
        if name in vocabulary:
            assert torch.equal(mine[kept], theirs[rows[kept]]), name
        elif name == "final_logits_bias":
            assert torch.equal(mine[0, kept], theirs[0, rows[kept]])
        else:
            assert torch.equal(mine, theirs), name
        compared += 1
    assert compared >= len(original) - 3  # every tensor but a tied or positional one
    # the start token stays one the model never outputs, in transformers and imported again
    generation = json.loads((out / "generation_config.json").read_text(encoding="utf-8"))
    assert generation["bad_words_ids"] == [[BOS_ID]]
    assert import_marian(out).model.suppress_start


def test_one_vocabulary_for_every_piece_is_one_embedding_matrix(corpus, tmp_path) -> None:
    """A vocab.json holding every source piece gives both sides the same ids: the source, the
    target and the output share one matrix, as in transformers; log-probabilities are still
    transformers', fine-tuning keeps the one matrix, and the HF export writes it once."""
    from safetensors.torch import load_file

    from nmt.ship.export import main as export_main
    from nmt.store.loading import load_trained
    from nmt.train.command import train

    from .helpers import QUIET_TINY_RUN, compose_config, corpus_overrides

    (tmp_path / "complete").mkdir()
    folder = make_marian(corpus, tmp_path / "complete", dropped=0)
    imported = import_marian(folder)
    m = imported.model
    assert m.src_embed.weight is m.tgt_embed.weight is m.out_proj.weight
    assert imported.fields["shared_embeddings"]
    hf = transformers.MarianMTModel.from_pretrained(str(folder)).eval()
    theirs_count = sum(p.numel() for n, p in hf.named_parameters() if "positions" not in n)
    # ours has one row more (our PAD), and an output bias as a parameter (theirs: a buffer)
    assert m.num_parameters() - theirs_count == m.d_model + m.out_proj.bias.numel()
    rows = torch.tensor(imported.vocab.tgt_rows)
    src_t, tgt_t, lens, mask, real = teacher_forced(imported.tokenizers, *sentences(corpus))
    with torch.inference_mode():
        ours = m(src_t, lens, tgt_t).log_softmax(-1)
        theirs = hf(input_ids=rows[src_t], attention_mask=mask.long(),
                    decoder_input_ids=rows[tgt_t]).logits.log_softmax(-1)  # fmt: skip
    assert (ours[..., 1:] - theirs[..., rows[1:]]).abs()[real].max() < 1e-4

    run = tmp_path / "run"
    assert import_main([str(folder), "--out", str(run)]) == 0
    overrides = [
        *corpus_overrides(corpus, tmp_path), f"outputs={tmp_path / 'outputs'}",
        f"trainer.init_from={run}", "trainer.max_steps=2", "trainer.val_every=2",
        "trainer.val_sentences=4", *QUIET_TINY_RUN,
    ]  # fmt: skip
    train(compose_config("train", overrides), tmp_path / "tuned", overrides)
    last = tmp_path / "tuned" / "checkpoints" / "last.pt"  # best.pt may be step 0's
    tuned = load_trained(last, torch.device("cpu")).model
    assert tuned.src_embed.weight is tuned.tgt_embed.weight is tuned.out_proj.weight
    assert not torch.equal(tuned.src_embed.weight, m.src_embed.weight)  # trained, once
    assert export_main([str(tmp_path / "tuned"), "--out", str(tmp_path / "hf"),
                        "--format", "hf"]) == 0  # fmt: skip
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert exported["share_encoder_decoder_embeddings"] is True
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert "model.encoder.embed_tokens.weight" not in weights or torch.equal(
        weights["model.encoder.embed_tokens.weight"], weights["model.shared.weight"]
    )


@pytest.mark.parametrize("beam", [1, 4])
def test_the_start_token_is_never_output_as_transformers_never_outputs_pad(
    corpus: Path, tmp_path: Path, beam: int
) -> None:
    """transformers' Marian never outputs pad, where its decoder starts: our BOS carries that
    row, and the imported model's search never outputs it. A folder whose pad logit wins at
    some steps decodes as ``generate`` does, in greedy and beam search (alpha 0: the same
    penalty), where a search without the rule outputs BOS."""
    from nmt.decode.search import beam_search

    folder = tmp_path / "marian"
    folder.mkdir()
    make_marian(corpus, folder, DROPPED)
    hf = transformers.MarianMTModel.from_pretrained(str(folder)).eval()
    pad = hf.config.pad_token_id
    with torch.no_grad():
        hf.final_logits_bias[0, pad] += 30.0  # pad the best choice at some steps
    hf.save_pretrained(str(folder))
    imported = import_marian(folder)
    src, _ = sentences(corpus, 24)
    tok, rows = imported.tokenizers, imported.vocab.tgt_rows
    src_ids = [tok.src.encode(s) + [EOS_ID] for s in src]
    s_len = max(map(len, src_ids))
    src_t = torch.tensor([s + [PAD_ID] * (s_len - len(s)) for s in src_ids])
    lens = torch.tensor([len(s) for s in src_ids])
    mask = torch.arange(s_len)[None] < lens[:, None]
    caps = torch.full((len(src),), 10)
    with torch.inference_mode():
        out = hf.generate(input_ids=torch.tensor(imported.vocab.src_rows)[src_t],
                          attention_mask=mask.long(), num_beams=beam, do_sample=False,
                          max_new_tokens=11, length_penalty=0.0, early_stopping=False,
                          bad_words_ids=[[pad]])  # fmt: skip
    theirs = [row[1 : row.index(0)] if 0 in row[1:] else row[1:] for row in out.tolist()]
    assert imported.model.suppress_start
    hyps = beam_search(imported.model, src_t, lens, caps, BOS_ID, EOS_ID, beam, 0.0)
    assert [[rows[t] for t in h.tokens] for h in hyps] == [
        [t for t in row if t != pad]
        for row in theirs  # generate pads the rows it ends early
    ]
    imported.model.suppress_start = False
    hyps = beam_search(imported.model, src_t, lens, caps, BOS_ID, EOS_ID, beam, 0.0)
    assert any(BOS_ID in h.tokens for h in hyps)  # the rule matters for this folder

"""A run imported from an M2M100 or NLLB-200 folder goes back into one (``nmt-export --format
hf``): as imported, the folder's own tensors and tokenizer files; fine-tuned, a model that
transformers decodes as our search does, with the folder's tokenizer and ids. Fine-tuning keeps
what that layout needs: the output bias fixed, our BOS reading their ``</s>`` row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nmt.config import ConfigError
from nmt.ship.export import main as export_main
from nmt.ship.import_command import main as import_main
from nmt.store.checkpoint import load_checkpoint

from .m2m100_folders import NLLB_LANGS, fine_tune_args, make_m2m100, make_nllb

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

pytestmark = [pytest.mark.usefixtures("one_thread")]

CPU = torch.device("cpu")
# what the architecture settings of the folder and of its export must agree on
ARCHITECTURE_KEYS = ("vocab_size", "d_model", "encoder_layers", "decoder_layers",
                     "encoder_ffn_dim", "encoder_attention_heads", "activation_function",
                     "max_position_embeddings", "scale_embedding", "pad_token_id",
                     "bos_token_id", "eos_token_id", "decoder_start_token_id")  # fmt: skip


@pytest.fixture(scope="module")
def folders(threeway: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    m2m100 = make_m2m100(threeway, tmp_path_factory.mktemp("m2m100"))
    nllb = make_nllb(m2m100, tmp_path_factory.mktemp("nllb"), tmp_path_factory.mktemp("spm"))
    return {"m2m100": m2m100, "nllb": nllb}


@pytest.fixture(scope="module")
def runs(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for kind, folder in folders.items():
        out[kind] = tmp_path_factory.mktemp(f"imported-{kind}") / "run"
        assert import_main([str(folder), "--out", str(out[kind])]) == 0
    return out


def fine_tuned(run: Path, threeway: Path, tmp_path: Path, steps: int = 3) -> Path:
    """``run`` fine-tuned for ``steps`` updates on de-en, at a learning rate that moves it;
    then, as a longer run's label smoothing could, the row of our BOS, which no id reads, far
    from EOS's (in ``last.pt``)."""
    from nmt.data.tokenizer import BOS_ID
    from nmt.store.checkpoint import save_checkpoint
    from nmt.train.command import train

    from .helpers import compose_config

    overrides = [*fine_tune_args(threeway, tmp_path, str(run), steps), "optim.lr=0.01",
                 "optim.warmup_steps=1"]  # fmt: skip
    train(compose_config("train", overrides), tmp_path / "tuned", overrides)
    last = tmp_path / "tuned" / "checkpoints" / "last.pt"
    payload = load_checkpoint(last)
    weight = payload["model"]["tgt_embed.weight"].clone()
    weight[BOS_ID] += 3.0
    for name in ("src_embed.weight", "tgt_embed.weight", "out_proj.weight"):  # one matrix
        payload["model"][name] = weight
    save_checkpoint(payload, last)
    return tmp_path / "tuned"


def their_tokenizer(kind: str, folder: Path, src: str, tgt: str):
    if kind == "nllb":
        src, tgt = NLLB_LANGS[src], NLLB_LANGS[tgt]
    return transformers.AutoTokenizer.from_pretrained(str(folder), src_lang=src, tgt_lang=tgt)


def forced_code(kind: str, tok, lang: str) -> int:
    return tok.convert_tokens_to_ids(NLLB_LANGS[lang] if kind == "nllb" else f"__{lang}__")


def sentences(threeway: Path, lang: str) -> list[str]:
    lines = Path(f"{threeway}.{lang}").read_text(encoding="utf-8").splitlines()[-6:]
    return [*lines, "Ein Zebra – 3½ Äpfel!"]


@pytest.mark.parametrize("kind", ["m2m100", "nllb"])
def test_an_import_exports_back_to_the_folders_own_tensors_and_files(
    kind: str, folders: dict[str, Path], runs: dict[str, Path], tmp_path: Path
) -> None:
    folder, out = folders[kind], tmp_path / "hf"
    assert export_main([str(runs[kind]), "--format", "hf", "--out", str(out)]) == 0
    theirs = safetensors_torch.load_file(str(folder / "model.safetensors"))
    ours = safetensors_torch.load_file(str(out / "model.safetensors"))
    # tied embeddings are saved under one of their names, whichever transformers picks
    tied = ("model.shared.weight", "model.encoder.embed_tokens.weight",
            "model.decoder.embed_tokens.weight", "lm_head.weight")  # fmt: skip
    embedding = {name: t for name, t in theirs.items() if name in tied}
    assert embedding
    for name, tensor in ours.items():
        expected = next(iter(embedding.values())) if name in tied else theirs[name]
        assert torch.equal(tensor, expected), name
    assert {n for n in theirs if n not in tied} == {n for n in ours if n not in tied}
    for name in ("sentencepiece.bpe.model", "tokenizer_config.json", "vocab.json",
                 "tokenizer.json"):  # fmt: skip
        if (folder / name).is_file():
            assert (out / name).read_bytes() == (folder / name).read_bytes(), name
    before = json.loads((folder / "config.json").read_text())
    after = json.loads((out / "config.json").read_text())
    assert {k: after[k] for k in ARCHITECTURE_KEYS} == {k: before[k] for k in ARCHITECTURE_KEYS}
    assert after["architectures"] == ["M2M100ForConditionalGeneration"]


@pytest.mark.parametrize("kind", ["m2m100", "nllb"])
def test_a_fine_tuned_import_exports_a_model_generate_decodes_as_our_search(
    kind: str, folders: dict[str, Path], runs: dict[str, Path], threeway: Path, tmp_path: Path
) -> None:
    """Greedy outputs of generate() with the target's code forced are our search's tokens, in
    the folder's ids, after fine-tuning moved the embeddings; the bias did not move, and our
    BOS still reads EOS's row."""
    from nmt.data.tokenizer import BOS_ID, EOS_ID
    from nmt.decode.engines import TorchEngine
    from nmt.decode.languages import choose_target, decode_ids_into
    from nmt.decode.options import DecodeOptions
    from nmt.store.loading import load_trained
    from nmt.store.paths import checkpoint_path

    tuned = fine_tuned(runs[kind], threeway, tmp_path)
    start = load_checkpoint(runs[kind] / "checkpoints" / "best.pt")["model"]
    end = load_checkpoint(tuned / "checkpoints" / "last.pt")["model"]
    assert not torch.equal(start["tgt_embed.weight"], end["tgt_embed.weight"])
    assert torch.equal(start["out_proj.bias"], end["out_proj.bias"])
    assert end["embed_rows"][BOS_ID] == EOS_ID
    assert not torch.equal(start["tgt_embed.weight"][EOS_ID], end["tgt_embed.weight"][EOS_ID])
    out = tmp_path / "hf"
    assert export_main([str(tuned), "--ckpt", "last", "--format", "hf", "--out", str(out)]) == 0
    trained = load_trained(checkpoint_path(tuned, "last"), CPU)
    ids = trained.tokenizers.origin["ids"]
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(out)).eval()
    opts = DecodeOptions(beam=1, max_output_len_a=0.0, max_output_len_b=10)
    for src_lang, tgt_lang in (("de", "en"),):  # the direction fine-tuned
        target = choose_target(trained.cfg, trained.tokenizers, tgt_lang, src_lang)
        src = sentences(threeway, src_lang)
        sources = trained.tokenizers.src.encode_batch(src)
        hyps = decode_ids_into(TorchEngine(trained.model, CPU), sources, target, opts)
        tok = their_tokenizer(kind, out, src_lang, tgt_lang)
        forced = forced_code(kind, tok, tgt_lang)
        with torch.inference_mode():
            rows = hf.generate(
                **tok(src, return_tensors="pt", padding=True),
                forced_bos_token_id=forced,
                num_beams=1,
                do_sample=False,
                max_new_tokens=12,
            ).tolist()  # code, 10, EOS: fmt: skip
        for hyp, row in zip(hyps, rows, strict=True):
            assert row[:2] == [2, forced]
            body = row[2 : row.index(2, 2)] if 2 in row[2:] else row[2:]
            assert [ids[t] for t in hyp.tokens] == body
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "forced_bos_token_id" in card and "m2m_100" in card


def test_the_ctranslate2_package_of_a_fine_tuned_import_decodes_as_our_search(
    runs: dict[str, Path], threeway: Path, tmp_path: Path
) -> None:
    """The package's embeddings are the rows each id reads (our BOS: EOS's), its output
    projection every row: the same greedy tokens and the same log-probability of each."""
    pytest.importorskip("ctranslate2")
    from nmt.data.tokenizer import BOS_ID, EOS_ID
    from nmt.decode.engines import TorchEngine, make_ct2_engine
    from nmt.decode.languages import choose_target, decode_ids_into
    from nmt.decode.options import DecodeOptions
    from nmt.ship.export import export_package
    from nmt.store.loading import load_package

    tuned = fine_tuned(runs["nllb"], threeway, tmp_path)
    package = export_package(tuned / "checkpoints" / "last.pt", tmp_path / "pkg",
                             fmt="ctranslate2", quantize="float32")  # fmt: skip
    loaded = load_package(package, CPU)
    opts = DecodeOptions(beam=1, max_output_len_a=0.0, max_output_len_b=10)
    target = choose_target(loaded.cfg, loaded.tokenizers, "en", "de")
    sources = loaded.tokenizers.src.encode_batch(sentences(threeway, "de"))
    ours = decode_ids_into(TorchEngine(loaded.model, CPU), sources, target, opts)
    theirs = decode_ids_into(make_ct2_engine(loaded, CPU), sources, target, opts)
    assert [h.tokens for h in theirs] == [h.tokens for h in ours]
    # every token's log-probability, the forced tag's first and the closing EOS's last
    engine, tok = make_ct2_engine(loaded, CPU), loaded.tokenizers.tgt
    for source, hyp in zip(sources, ours, strict=True):
        out, source = [target.tag, *hyp.tokens], [tok.tags["de"], *source]
        scored = engine.translator.score_batch([engine._source(source)], [tok.pieces(out)])
        src = torch.tensor([[*source, EOS_ID]])
        with torch.inference_mode():
            logits = loaded.model(src, torch.tensor([src.size(1)]), torch.tensor([[BOS_ID, *out]]))
        mine = logits.log_softmax(-1)[0].gather(1, torch.tensor([*out, EOS_ID])[:, None])[:, 0]
        assert torch.allclose(torch.tensor(scored[0].log_probs), mine, atol=1e-3)


def test_a_trained_output_bias_is_refused(runs: dict[str, Path]) -> None:
    """M2M100 has no output bias: ours may only hold the ids it lacks at NEVER."""
    from nmt.ship.hf_m2m100 import hf_weights
    from nmt.store.loading import load_trained
    from nmt.store.paths import checkpoint_path

    trained = load_trained(checkpoint_path(runs["m2m100"]), CPU)
    origin = trained.tokenizers.origin
    hf_weights(trained.model, origin)  # as imported: exported
    with torch.no_grad():
        trained.model.out_proj.bias[10] += 0.5
    with pytest.raises(ConfigError, match="output bias was trained"):
        hf_weights(trained.model, origin)


def test_a_package_of_an_import_is_refused_with_the_reason(
    runs: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A package keeps the sentencepiece model, not the folder's layout: exit 2, one line
    that says to export from the run, nothing written."""
    from nmt.ship.export import export_package

    package = export_package(runs["m2m100"] / "checkpoints" / "best.pt", tmp_path / "pkg")
    with pytest.raises(SystemExit) as stop:
        export_main([str(package), "--format", "hf", "--out", str(tmp_path / "hf")])
    assert stop.value.code == 2
    assert "its checkpoint, which keeps the folder's layout" in caplog.text
    assert not (tmp_path / "hf").exists()


def test_the_marian_parity_check_refuses_an_import_with_the_reason(runs: dict[str, Path]) -> None:
    from nmt.ship.hf_check import check_run

    with pytest.raises(ConfigError, match="nmt-export --format hf itself compares"):
        check_run(runs["nllb"] / "checkpoints" / "best.pt")

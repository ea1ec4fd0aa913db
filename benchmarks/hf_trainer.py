"""Fine-tuning and decoding an imported model beside transformers' own ``Seq2SeqTrainer`` and
``generate``: the same model, the same batches, the same machine.

**The model** is a random ``MarianMTModel`` of Helsinki-NLP/opus-mt-de-en's shape (6+6 layers,
width 512, swish, 58,101 rows shared by the embeddings and the output), made by transformers
with MarianTokenizer's files (two unigram sentencepiece models trained on Multi30k, one
``vocab.json``; rows the models do not reach fill the vocabulary to its size). ``nmt-import``
reads it into a run. Its quality is not the point, its cost is.

**Fine-tuning.** Both train on the same first ``pairs`` de-en pairs of Multi30k's training
split, in batches built the same way: pairs of about the same length, as many as fit
``max_tokens`` counted as sentences x the longest side (``data.max_tokens``' rule; transformers
gets them through a batch sampler, since its own ``per_device_train_batch_size`` counts
sentences). The same label smoothing (0.1), gradient clipping (1.0), learning rate and warmup,
dropout from the model's config; one process, the machine's threads. Ours is ``nmt-train
trainer.init_from=<the imported run>``, with its time per update read from its metrics
(``trainer.log_every=1``); theirs a ``Seq2SeqTrainer`` whose updates are timed from one update's
end to the next (data loading included, as ours). The first ``skip`` updates of each run are
not counted. Each precision is run by both, alternating, ``rounds`` times: target tokens per
second (padding excluded, EOS included), medians, and the ratio per round.

**Decoding**, in one process: our search on the imported run and its CTranslate2 package
against ``generate`` on the transformers model, on Multi30k's test_2016_flickr sources in
batches of ``decode_batch`` sentences sorted by length, greedy and beam 4, every output made
exactly ``decode_length`` tokens long (a random model seldom ends a sentence: without this the
searches would stop at different lengths).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.finetune_scale import lines, write_corpus

# Helsinki-NLP/opus-mt-de-en's shape (its config.json)
OPUS_MT_DE_EN = {
    "vocab_size": 58101, "d_model": 512, "encoder_layers": 6, "decoder_layers": 6,
    "encoder_attention_heads": 8, "decoder_attention_heads": 8, "encoder_ffn_dim": 2048,
    "decoder_ffn_dim": 2048, "activation_function": "swish", "max_position_embeddings": 512,
    "scale_embedding": True, "static_position_embeddings": True, "dropout": 0.1,
    "attention_dropout": 0.0, "activation_dropout": 0.0,
}  # fmt: skip
# a small model of the same kind, for a quick check of the bench itself
TINY = OPUS_MT_DE_EN | {
    "vocab_size": 4000, "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
    "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
}  # fmt: skip
SPM_PIECES = 6000  # each side's sentencepiece model (the quick check: 1,000)
LR, WARMUP, SMOOTHING, CLIP = 5e-5, 10, 0.1, 1.0
BEAM = 4


@dataclass
class Settings:
    work: Path
    multi30k: Path  # the folder of Multi30k's .gz files
    cwd: Path  # the checkout (benchmarks/ and nmt/ importable from it)
    rounds: int = 3
    updates: int = 16  # per run
    skip: int = 3  # first updates of a run not counted
    max_tokens: int = 2048
    precisions: list[str] = field(default_factory=lambda: ["32", "bf16"])
    pairs: int = 4000
    decode_sentences: int = 256
    decode_batch: int = 32
    decode_length: int = 24
    decode_rounds: int = 2
    quick: bool = False

    @property
    def shape(self) -> dict[str, Any]:
        return TINY if self.quick else OPUS_MT_DE_EN


# ----------------------------------------------------------------------------- the model


def spm_model(text: list[str], size: int, threads: int = 1) -> bytes:
    """A unigram sentencepiece model as Marian's converter leaves them: unk 0, bos 1, eos 2."""
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=out, vocab_size=size, model_type="unigram",
        character_coverage=1.0, minloglevel=2, num_threads=threads,
    )  # fmt: skip
    return out.getvalue()


def pieces(proto: bytes) -> list[str]:
    """The pieces of a sentencepiece model after its three specials."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(proto)
    return [sp.IdToPiece(i) for i in range(3, sp.GetPieceSize())]


def make_folder(s: Settings, folder: Path) -> dict[str, Any]:
    """The random Marian folder (MarianTokenizer's files and the model); its size."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    size = 1000 if s.quick else SPM_PIECES
    source = spm_model(lines(s.multi30k, "train", "de", 29000), size, threads=2)
    target = spm_model(lines(s.multi30k, "train", "en", 29000), size, threads=2)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    rows = s.shape["vocab_size"]
    known = list(dict.fromkeys(pieces(source) + pieces(target)))
    if len(known) + 3 > rows:
        raise ValueError(f"{len(known)} pieces do not fit vocab_size={rows}")
    unused = [f"\u2581unused{i}" for i in range(rows - 3 - len(known))]  # rows no piece reaches
    vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(known + unused)}}
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "de", "target_lang": "en", "model_max_length": 512}),
        encoding="utf-8",
    )
    config = transformers.MarianConfig(
        **s.shape, pad_token_id=vocab["<pad>"], eos_token_id=0,
        decoder_start_token_id=vocab["<pad>"], forced_eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config)
    model.save_pretrained(folder)
    return {"parameters": sum(p.numel() for p in model.parameters()), "pieces": len(known)}


# ------------------------------------------------------------------------------ training


def ours(s: Settings, run: Path, corpus: Path, valid: Path, precision: str, tag: str) -> dict:
    """One fine-tuning run of ours; its per-update seconds and target tokens."""
    out = s.work / "ours" / tag
    overrides = [
        f"trainer.init_from={run}", "data=parallel", "data.src_lang=de", "data.tgt_lang=en",
        f"data.train={corpus}", f"data.valid={valid}", f"data.root={s.work / 'data'}",
        f"outputs={s.work / 'outputs'}", f"data.max_tokens={s.max_tokens}",
        f"trainer.max_steps={s.updates}", f"trainer.val_every={s.updates * 1000}",
        "trainer.val_sentences=4", "trainer.log_every=1", "trainer.progress=false",
        "trainer.attention_sentences=0", f"trainer.precision={precision}",
        f"trainer.label_smoothing={SMOOTHING}", f"trainer.clip_grad_norm={CLIP}",
        f"optim.lr={LR}", f"optim.warmup_steps={WARMUP}", f"hydra.run.dir={out}",
    ]  # fmt: skip
    log = s.work / f"ours-{tag}.log"
    with open(log, "w") as f:
        done = subprocess.run([sys.executable, "-m", "nmt.train", *overrides], cwd=s.cwd,
                              stdout=f, stderr=subprocess.STDOUT)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"nmt-train failed ({done.returncode}); see {log}")
    events = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    trains = [e for e in events if e["event"] == "train"]
    start = next(e for e in events if e["event"] == "start")
    return {
        "seconds": [e["seconds"] / e["updates"] for e in trains],
        "tokens": [e["tokens"] / e["updates"] for e in trains],
        "precision": start.get("precision", precision),
    }


def token_batches(src: list[int], tgt: list[int], max_tokens: int, seed: int) -> list[list[int]]:
    """Pairs of about the same length, as many as fit ``max_tokens`` counted as sentences x
    the longest side (:func:`nmt.data.batching.cut_batches`); shuffled within lengths, batches
    in a shuffled order."""
    from nmt.data.batching import cut_batches

    rng = random.Random(seed)
    order = list(range(len(src)))
    rng.shuffle(order)
    longest = np.maximum(src, tgt)  # (N,)
    order.sort(key=lambda i: longest[i])
    batches = list(cut_batches(np.asarray(order, dtype=np.int64), longest, max_tokens))
    rng.shuffle(batches)
    return batches


def theirs(s: Settings, folder: Path, corpus: Path, precision: str, tag: str) -> dict:
    """One Seq2SeqTrainer run in a child process (this module's ``hf-train``)."""
    out = s.work / f"theirs-{tag}.json"
    command = [
        sys.executable, "-m", "benchmarks.hf_trainer", "hf-train", "--folder", str(folder),
        "--corpus", str(corpus), "--precision", precision, "--updates", str(s.updates),
        "--max-tokens", str(s.max_tokens), "--out", str(out),
        "--work", str(s.work / "theirs" / tag),
    ]  # fmt: skip
    log = s.work / f"theirs-{tag}.log"
    with open(log, "w") as f:
        done = subprocess.run(command, cwd=s.cwd, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"Seq2SeqTrainer failed ({done.returncode}); see {log}")
    return json.loads(out.read_text())


def hf_train(args: argparse.Namespace) -> None:
    """Fine-tune with transformers' Seq2SeqTrainer; per-update seconds and target tokens."""
    import torch
    import transformers
    from torch.utils.data import DataLoader

    tok = transformers.MarianTokenizer.from_pretrained(args.folder)
    model = transformers.MarianMTModel.from_pretrained(args.folder)
    src = Path(f"{args.corpus}.de").read_text(encoding="utf-8").splitlines()
    tgt = Path(f"{args.corpus}.en").read_text(encoding="utf-8").splitlines()
    encoded = tok(src, text_target=tgt, truncation=True, max_length=512)
    rows = [
        {"input_ids": a, "attention_mask": m, "labels": b}
        for a, m, b in zip(
            encoded["input_ids"], encoded["attention_mask"], encoded["labels"], strict=True
        )
    ]
    src_lens, tgt_lens = [len(r["input_ids"]) for r in rows], [len(r["labels"]) for r in rows]
    batches = token_batches(src_lens, tgt_lens, args.max_tokens, seed=1234)
    collator = transformers.DataCollatorForSeq2Seq(tok, model=model)
    ends: list[float] = []
    tokens: list[int] = []

    class Timer(transformers.TrainerCallback):
        def on_train_begin(self, *a: Any, **k: Any) -> None:
            ends.append(time.perf_counter())

        def on_step_end(self, *a: Any, **k: Any) -> None:
            ends.append(time.perf_counter())

    class Trainer(transformers.Seq2SeqTrainer):
        def get_train_dataloader(self) -> Any:
            loader = DataLoader(rows, batch_sampler=batches, collate_fn=self.data_collator)
            return self.accelerator.prepare(loader)

        def training_step(self, model: Any, inputs: Any, *rest: Any, **kw: Any) -> Any:
            tokens.append(int((inputs["labels"] != -100).sum()))
            return super().training_step(model, inputs, *rest, **kw)

    training = transformers.Seq2SeqTrainingArguments(
        output_dir=args.work, max_steps=args.updates, learning_rate=LR, warmup_steps=WARMUP,
        label_smoothing_factor=SMOOTHING, max_grad_norm=CLIP, bf16=args.precision == "bf16",
        use_cpu=True, logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True,
        dataloader_num_workers=0, seed=1234,
    )  # fmt: skip
    trainer = Trainer(model=model, args=training, data_collator=collator, callbacks=[Timer()])
    trainer.train()
    seconds = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    Path(args.out).write_text(json.dumps({
        "seconds": seconds, "tokens": tokens[: len(seconds)], "precision": args.precision,
        "optim": str(training.optim), "threads": torch.get_num_threads(),
        "transformers": transformers.__version__,
    }))  # fmt: skip


def tokens_per_s(run: dict, skip: int) -> float:
    seconds, tokens = run["seconds"][skip:], run["tokens"][skip:]
    return sum(tokens) / sum(seconds)


def bench_training(s: Settings, folder: Path, run: Path) -> dict[str, Any]:
    """Per round: each precision by theirs then ours, then ours in precision ``auto``."""
    corpus, valid = write_corpus(s.work, s.multi30k, s.pairs)
    rounds: dict[str, list[dict]] = {p: [] for p in [*s.precisions, "auto"]}
    for r in range(s.rounds):
        best_theirs = 0.0
        for precision in s.precisions:
            tag = f"{precision}-{r}"
            a = theirs(s, folder, corpus, precision, tag)
            b = ours(s, run, corpus, valid, precision, tag)
            rounds[precision].append(figures(a, b, s.skip))
            best_theirs = max(best_theirs, rounds[precision][-1]["theirs"])
            say(f"{precision} round {r + 1}", rounds[precision][-1])
        b = ours(s, run, corpus, valid, "auto", f"auto-{r}")
        rounds["auto"].append({**figures(None, b, s.skip), "theirs": best_theirs})
        say(f"auto round {r + 1} (theirs: their best precision)", rounds["auto"][-1])
    return {p: summary(rs) for p, rs in rounds.items()}


def figures(a: dict | None, b: dict, skip: int) -> dict[str, Any]:
    """One round's figures of theirs (``a``) and ours (``b``)."""
    out = {
        "ours": tokens_per_s(b, skip),
        "ours_tokens_per_update": statistics.mean(b["tokens"][skip:]),
        "ours_precision": b["precision"],
    }
    if a is not None:
        out |= {
            "theirs": tokens_per_s(a, skip),
            "theirs_tokens_per_update": statistics.mean(a["tokens"][skip:]),
            "theirs_optim": a["optim"],
        }
    return out


def say(what: str, r: dict[str, Any]) -> None:
    print(f"[hf-trainer] {what}: theirs {r['theirs']:.0f}, ours {r['ours']:.0f} "
          f"({r['ours_precision']}) target tokens/s", flush=True)  # fmt: skip


def summary(rounds: list[dict]) -> dict[str, Any]:
    ratios = [r["ours"] / r["theirs"] for r in rounds]
    return {
        "rounds": rounds,
        "theirs_median": statistics.median(r["theirs"] for r in rounds),
        "ours_median": statistics.median(r["ours"] for r in rounds),
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
    }


# ------------------------------------------------------------------------------ decoding


def bench_decoding(s: Settings, folder: Path, run: Path) -> dict[str, Any]:
    """Our search, our CTranslate2 package and generate on the same sources (see module doc)."""
    from dataclasses import replace

    import torch
    import transformers

    from nmt.data.datasets import encode_texts
    from nmt.decode import ct2
    from nmt.decode.engines import TorchEngine, make_engine
    from nmt.decode.options import DecodeOptions
    from nmt.ship.export import export_package
    from nmt.store.loading import load_package
    from nmt.store.paths import checkpoint_path

    cpu = torch.device("cpu")
    src = lines(s.multi30k, "test_2016_flickr", "de", s.decode_sentences)
    ref = lines(s.multi30k, "test_2016_flickr", "en", s.decode_sentences)
    pkg = load_package(export_package(checkpoint_path(run), s.work / "pkg-torch"), cpu)
    engines: dict[str, Any] = {"ours": TorchEngine(pkg.model, cpu)}
    length = s.decode_length
    base = DecodeOptions(max_tokens=10**6, max_output_len_a=0.0, max_output_len_b=length,
                         min_output_len=length)  # fmt: skip
    if ct2.available():
        ct2_dir = export_package(checkpoint_path(run), s.work / "pkg-ct2", fmt="ctranslate2")
        engines["ours-ctranslate2"] = make_engine("ctranslate2", load_package(ct2_dir, cpu),
                                                  base, cpu)  # fmt: skip
    order = sorted(range(len(src)), key=lambda i: len(src[i].split()))
    batches = [order[i : i + s.decode_batch] for i in range(0, len(order), s.decode_batch)]
    tok = transformers.MarianTokenizer.from_pretrained(str(folder))
    hf = transformers.MarianMTModel.from_pretrained(str(folder)).eval()
    # as an OPUS-MT model's generation config has it: pad is never output; no EOS forced at
    # the length limit (ours ends there, as generate does without it)
    hf.generation_config.bad_words_ids = [[hf.config.pad_token_id]]
    hf.generation_config.forced_eos_token_id = None
    hf_inputs = [tok([src[i] for i in b], return_tensors="pt", padding=True) for b in batches]
    data = [encode_texts(pkg.tokenizers, [src[i] for i in b], [ref[i] for i in b]) for b in batches]
    out: dict[str, Any] = {}
    for beam in (1, BEAM):
        opts = replace(base, beam=beam, length_penalty=1.0)

        timings: dict[str, list[float]] = {name: [] for name in [*engines, "generate"]}
        for _ in range(s.decode_rounds):  # alternating
            for name, engine in engines.items():
                start = time.perf_counter()
                for d in data:
                    engine.hypotheses(d, opts)
                timings[name].append(time.perf_counter() - start)
            start = time.perf_counter()
            with torch.inference_mode():
                for inputs in hf_inputs:
                    hf.generate(**inputs, num_beams=beam, do_sample=False, min_new_tokens=length,
                                max_new_tokens=length, length_penalty=1.0)  # fmt: skip
            timings["generate"].append(time.perf_counter() - start)
        best = {name: min(t) for name, t in timings.items()}
        out[f"beam{beam}"] = {
            "seconds": timings,
            "sentences_per_s": {n: len(src) / t for n, t in best.items()},
            "speed_vs_generate": {n: best["generate"] / t for n, t in best.items()},
        }
        print(f"[hf-trainer] decoding beam {beam}: "
              + ", ".join(f"{n} {len(src) / t:.1f}" for n, t in best.items())
              + " sentences/s", flush=True)  # fmt: skip
    return out


# ----------------------------------------------------------------------------------- run


def run(s: Settings, parts: tuple[str, ...] = ("train", "decode")) -> dict[str, Any]:
    import torch
    import transformers

    if s.work.exists():  # the bench's own folder: every run starts from nothing
        shutil.rmtree(s.work)
    folder, imported = s.work / "marian-random", s.work / "imported"
    made = make_folder(s, folder)
    done = subprocess.run(
        [sys.executable, "-m", "nmt.ship.import_command", str(folder), "--out", str(imported)],
        cwd=s.cwd, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"nmt-import failed: {done.stderr.strip()}")
    result: dict[str, Any] = {
        "model": {"shape": s.shape, **made},
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(s).items()},
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
    }
    if "train" in parts:
        result["training"] = bench_training(s, folder, imported)
    if "decode" in parts:
        result["decoding"] = bench_decoding(s, folder, imported)
    return result


def report(result: dict[str, Any]) -> str:
    text = [f"a random MarianMT of {result['model']['parameters'] / 1e6:.1f}M parameters"]
    for precision, t in result.get("training", {}).items():
        text.append(
            f"fine-tuning, {precision}: ours {t['ours_median']:.0f}, Seq2SeqTrainer "
            f"{t['theirs_median']:.0f} target tokens/s (medians); ours/theirs per round "
            + ", ".join(f"{r:.2f}" for r in t["ratios"])
        )
    for beam, d in result.get("decoding", {}).items():
        text.append(
            f"decoding, {beam}: "
            + ", ".join(f"{n} {v:.1f}" for n, v in d["sentences_per_s"].items())
            + " sentences/s"
        )
    return "\n".join(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    child = sub.add_parser("hf-train")
    for name in ("--folder", "--corpus", "--precision", "--out", "--work"):
        child.add_argument(name, required=True)
    child.add_argument("--updates", type=int, required=True)
    child.add_argument("--max-tokens", type=int, required=True)
    args = parser.parse_args(argv)
    hf_train(args)


if __name__ == "__main__":
    main()

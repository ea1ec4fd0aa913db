"""Fine-tuning a model of NLLB-200-distilled-600M's shape on this machine: a random
``M2M100ForConditionalGeneration`` made by transformers (its layers, widths and vocabulary;
NllbTokenizer's ids over a small sentencepiece model, the rest of its 256,206 rows kept as
classes), imported with ``nmt-import``, then fine-tuned on Multi30k de-en with ``nmt-train``
(``trainer.init_from=<the run>``) for a few updates: the import's seconds and peak memory,
each update's seconds, and the training process's peak resident memory.

Nothing here needs the network. The model is random: its quality is not the point, its cost is.
"""

from __future__ import annotations

import gzip
import io
import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# NLLB-200-distilled-600M's shape (its config.json)
NLLB_600M = {
    "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12, "encoder_attention_heads": 16,
    "decoder_attention_heads": 16, "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096,
    "vocab_size": 256206, "max_position_embeddings": 1024, "activation_function": "relu",
    "scale_embedding": True, "dropout": 0.1, "attention_dropout": 0.1, "pad_token_id": 1,
    "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2,
}  # fmt: skip


# the validation pairs: the step-0 validation of a fine-tuning run scores them (its cost is not
# the updates')
VALID_PAIRS = 16


@dataclass
class FinetuneSettings:
    work: Path
    multi30k: Path  # the folder of Multi30k's .gz files
    cwd: Path
    updates: int = 4
    max_tokens: int = 2048
    precision: str = "bf16"
    freeze: list[str] = field(default_factory=list)
    pairs: int = 2000


def lines(multi30k: Path, split: str, lang: str, n: int) -> list[str]:
    """The first ``n`` lines of a Multi30k split's side (its ``.gz`` file)."""
    with gzip.open(multi30k / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return f.read().split("\n")[:n]


def write_corpus(work: Path, multi30k: Path, pairs: int) -> tuple[Path, Path]:
    """The first ``pairs`` de-en pairs of Multi30k's training split as the training corpus
    ``<work>/corpus/train.{de,en}``, the next VALID_PAIRS as its validation set; both
    prefixes."""
    train, valid = work / "corpus" / "train", work / "corpus" / "valid"
    train.parent.mkdir(parents=True, exist_ok=True)
    for lang in ("de", "en"):
        text = lines(multi30k, "train", lang, pairs + VALID_PAIRS)
        Path(f"{train}.{lang}").write_text("\n".join(text[:pairs]) + "\n", encoding="utf-8")
        Path(f"{valid}.{lang}").write_text("\n".join(text[pairs:]) + "\n", encoding="utf-8")
    return train, valid


def make_folder(s: FinetuneSettings, folder: Path) -> dict[str, Any]:
    """The random NLLB-shaped folder; its parameter count and the seconds it took."""
    import sentencepiece as spm
    import torch
    import transformers
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    start = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    text = lines(s.multi30k, "train", "de", 5000) + lines(s.multi30k, "train", "en", 5000)
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=out, vocab_size=8000, model_type="bpe",
        minloglevel=2, num_threads=2,
    )  # fmt: skip
    spm_dir = folder / "spm"
    spm_dir.mkdir(exist_ok=True)
    (spm_dir / "sentencepiece.bpe.model").write_bytes(out.getvalue())
    tok = transformers.NllbTokenizer.from_pretrained(
        str(spm_dir), extra_special_tokens=list(FAIRSEQ_LANGUAGE_CODES)
    )
    tok.save_pretrained(folder)
    (folder / "sentencepiece.bpe.model").write_bytes(out.getvalue())
    torch.manual_seed(0)
    model = transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(**NLLB_600M))
    model.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    return {"parameters": params, "seconds": time.perf_counter() - start}


def _child_peak_mib() -> float:
    """The peak resident memory of the largest child process waited for so far (MiB)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def timed_child(command: list[str], cwd: Path, log: Path) -> dict[str, Any]:
    """Run ``command`` as a child process; its seconds and the children's peak RSS."""
    start = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"{command[2:4]} failed ({done.returncode}); see {log}")
    return {"seconds": time.perf_counter() - start, "peak_rss_mib": _child_peak_mib()}


def run(s: FinetuneSettings) -> dict[str, Any]:
    folder, run_dir = s.work / "nllb-600m-random", s.work / "imported"
    made = make_folder(s, folder)
    importing = timed_child(
        [sys.executable, "-m", "nmt.ship.import_command", str(folder), "--out", str(run_dir)],
        s.cwd, s.work / "import.log",
    )  # fmt: skip
    corpus, valid = write_corpus(s.work, s.multi30k, s.pairs)
    tuned = s.work / "tuned"
    overrides = [
        f"trainer.init_from={run_dir}", "data=parallel", "data.directions=[de-en]",
        f"data.train={corpus}", f"data.valid={valid}", f"data.root={s.work / 'data'}",
        f"outputs={s.work / 'outputs'}", f"data.max_tokens={s.max_tokens}",
        f"trainer.max_steps={s.updates}", f"trainer.val_every={s.updates * 1000}",
        "trainer.val_sentences=8", "trainer.log_every=1", "trainer.progress=false",
        "trainer.attention_sentences=0", f"trainer.precision={s.precision}",
        f"trainer.freeze=[{','.join(s.freeze)}]", f"hydra.run.dir={tuned}",
    ]  # fmt: skip
    training = timed_child([sys.executable, "-m", "nmt.train", *overrides], s.cwd,
                           s.work / "train.log")  # fmt: skip
    events = [json.loads(line) for line in (tuned / "metrics.jsonl").read_text().splitlines()]
    updates = [e for e in events if e.get("event") == "train"]
    seconds = [e["seconds"] / max(e.get("updates", 1), 1) for e in updates]
    return {
        "shape": NLLB_600M,
        "folder": made,
        "import": importing,
        "train": training,
        "seconds_per_update": seconds,
        "tokens_per_update": [e["tokens"] / max(e.get("updates", 1), 1) for e in updates],
        "settings": {
            "updates": s.updates,
            "max_tokens": s.max_tokens,
            "precision": s.precision,
            "freeze": s.freeze,
            "pairs": s.pairs,
        },  # fmt: skip
    }


def report(result: dict[str, Any]) -> str:
    per = sorted(result["seconds_per_update"][1:] or result["seconds_per_update"])
    median = per[len(per) // 2] if per else float("nan")
    return (
        f"{result['folder']['parameters'] / 1e6:.0f}M parameters; import "
        f"{result['import']['seconds']:.0f} s, peak {result['import']['peak_rss_mib']:.0f} MiB; "
        f"fine-tuning ({result['settings']['precision']}, freeze="
        f"{result['settings']['freeze'] or 'none'}): median {median:.1f} s per update after "
        f"the first, peak {result['train']['peak_rss_mib']:.0f} MiB"
    )

"""The parity of a run's ``--format hf`` export on its test set (``make check-hf``).

Three checks, each against our own decoding of the same sentences:

* greedy search: the share of sentences whose tokens transformers' ``generate(num_beams=1)``
  reproduces exactly (wanted: at least 99%), with our per-sentence cap given as
  ``max_new_tokens`` (sentences are decoded in groups of equal cap);
* beam search: corpus BLEU of transformers' beam search with the exported generation config
  and our caps, against ours, twice: what ``generate`` returns (reported), and its whole beam
  (``num_return_sequences=beam``) ranked by our length penalty, the sums of log-probabilities
  taken from the model by a teacher-forced pass (wanted: within 0.1). Both searches extend the
  same hypotheses (alive beams are ranked by summed log-probability alone), but transformers
  ranks finished ones by ``sum / n ** alpha`` where we rank by ``sum / ((5 + n) / 6) ** alpha``
  and scores the EOS it forces at the cap 0; what re-ranking cannot undo is which finished
  hypotheses its beam kept and when it stopped;
* the text a user gets: the tokenizer, ``generate`` with the folder's defaults and our caps,
  and ``batch_decode`` (the steps of the ``pipeline("translation")`` that transformers 5, the
  version the ``hf`` extra installs, no longer has), against our detokenized greedy output.

A multilingual run is checked in each trained direction, a report per direction under
``directions``, its language codes where its ``data.tag_placement`` puts them: the target's
first in the source text (``>>fr<< ...``), or ``forced_bos_token_id`` (the code's id) given to
``generate``, with the source's code first in the text at ``both``.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt.config import ConfigError
from nmt.data.corpus import read_parallel, strip_lines
from nmt.data.datasets import EvalSet, load_test_sets
from nmt.data.multilingual import directions_of, first_source_token, placement_of
from nmt.data.multiprep import resolve_direction_splits
from nmt.data.tagged import tagged_dataset
from nmt.data.tokenizer import EOS_ID
from nmt.decode.options import DecodeOptions
from nmt.decode.search import decode_dataset, length_penalty
from nmt.environment import multi30k_source
from nmt.evaluate.metrics import bleu
from nmt.ship import hf
from nmt.ship.export import export_hf
from nmt.store.loading import Trained, decode_defaults, load_trained

log = logging.getLogger(__name__)

GREEDY_SHARE, BLEU_GAP = 0.99, 0.1
USER_STEPS = "tokenizer + generate + batch_decode"


def _groups(caps: list[int], batch: int) -> list[tuple[int, list[int]]]:
    """Batches of sentence indices that share a cap: (cap, indices), the smallest caps first."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, cap in enumerate(caps):
        groups[cap].append(i)
    return [
        (cap, rows[start : start + batch])
        for cap, rows in sorted(groups.items())
        for start in range(0, len(rows), batch)
    ]


def _strip(row: list[int]) -> list[int]:
    """Output tokens of one generated row: no start token, nothing from EOS on."""
    row = row[1:]
    return row[: row.index(EOS_ID)] if EOS_ID in row else row


def hf_generate(
    model: Any, tok: Any, sources: list[str], caps: list[int], batch: int, **options: Any
) -> list[list[int]]:
    """transformers' output tokens (no start token, no EOS) for each source, decoded in
    batches of sentences that share a cap."""
    out: list[list[int]] = [[] for _ in sources]
    for cap, part in _groups(caps, batch):
        enc = tok([sources[i] for i in part], return_tensors="pt", padding=True)
        with torch.inference_mode():
            seqs = model.generate(**enc, max_new_tokens=cap + 1, **options)
        for i, row in zip(part, seqs.tolist(), strict=True):
            out[i] = _strip(row)
    return out


def summed_log_probs(
    model: Any, enc: dict[str, Tensor], seqs: Tensor, k: int, forced: bool = False
) -> Tensor:
    """The summed log-probability of each generated row, its EOS included, teacher-forced.

    enc: the tokenizer's batch of B sources; seqs: (B * k, 1 + L) rows of ``generate`` (the
    start token, the output, EOS, padding), k rows per source. Scores ``generate`` returns are
    those after its logits processors (the EOS forced at the cap scores 0 there), so they are
    recomputed here from the model's own distribution, as our search scores; a ``forced``
    first token scores 0, as in ours. Returns (B * k,).
    """
    target = seqs[:, 1:]  # (N, L)
    ended = (target == EOS_ID).long().cumsum(1)  # (N, L) EOS seen up to here, inclusive
    real = (ended - (target == EOS_ID).long()) == 0  # (N, L) up to the first EOS, inclusive
    if forced:
        real[:, 0] = False
    with torch.inference_mode():
        logits = model(
            input_ids=enc["input_ids"].repeat_interleave(k, 0),
            attention_mask=enc["attention_mask"].repeat_interleave(k, 0),
            decoder_input_ids=seqs[:, :-1],
        ).logits  # (N, L, V)
        logp = logits.float().log_softmax(-1).gather(2, target[:, :, None]).squeeze(2)
    return (logp * real).sum(1)  # (N,)


def gnmt_best(nbest: list[tuple[list[int], float]], alpha: float) -> int:
    """Index of the hypothesis our beam search prefers among ``nbest`` (tokens without EOS,
    summed log-probability with EOS): the best sum / ((5 + n) / 6) ** alpha, n counting EOS
    (:func:`nmt.decode.search.length_penalty`); the first of equals."""
    lengths = torch.tensor([len(tokens) + 1 for tokens, _ in nbest])  # (k,)
    sums = torch.tensor([score for _, score in nbest], dtype=torch.float)  # (k,)
    normalised = (sums / length_penalty(lengths, alpha)).tolist()
    return max(range(len(nbest)), key=lambda j: (normalised[j], -j))


def hf_nbest(
    model: Any,
    tok: Any,
    sources: list[str],
    caps: list[int],
    batch: int,
    beam: int,
    **options: Any,
) -> list[list[tuple[list[int], float]]]:
    """transformers' beam search with ``num_return_sequences=beam``: per source, its finished
    hypotheses in its own order (best first under its length penalty), each as output tokens
    (no start token, no EOS) and summed log-probability (:func:`summed_log_probs`)."""
    out: list[list[tuple[list[int], float]]] = [[] for _ in sources]
    for cap, part in _groups(caps, batch):
        enc = tok([sources[i] for i in part], return_tensors="pt", padding=True)
        with torch.inference_mode():
            seqs = model.generate(
                **enc, max_new_tokens=cap + 1, num_beams=beam, num_return_sequences=beam,
                do_sample=False, **options,
            )  # fmt: skip
        forced = options.get("forced_bos_token_id") is not None
        sums = summed_log_probs(model, enc, seqs, beam, forced).tolist()
        rows = seqs.tolist()
        for n, i in enumerate(part):
            out[i] = [(_strip(rows[j]), sums[j]) for j in range(n * beam, (n + 1) * beam)]
    return out


def reranked(nbest: list[list[tuple[list[int], float]]], alpha: float) -> list[list[int]]:
    """The hypothesis of each n-best list that our length penalty ranks first."""
    return [hyps[gnmt_best(hyps, alpha)][0] for hyps in nbest]


def user_texts(
    model: Any, tok: Any, sources: list[str], caps: list[int], **options: Any
) -> tuple[list[str], str]:
    """What a user's translation call returns (tokenizer, ``generate``, ``batch_decode``), and
    how it was made."""
    tokens = hf_generate(model, tok, sources, caps, 64, num_beams=1, do_sample=False, **options)
    return tok.batch_decode(tokens, skip_special_tokens=True), USER_STEPS


def beam_report(
    ours: list[str],
    nbest: list[list[tuple[list[int], float]]],
    detokenize: Callable[[list[list[int]]], list[str]],
    refs: list[str],
    alpha: float,
) -> dict[str, Any]:
    """Corpus BLEU of our beam search's texts ``ours`` against transformers': the first of
    each of its n-best lists (what ``generate`` returns) and the one our length penalty
    ranks first (:func:`reranked`). The check holds when the re-ranked BLEU is within
    ``BLEU_GAP`` of ours."""
    plain = detokenize([hyps[0][0] for hyps in nbest])
    ranked = detokenize(reranked(nbest, alpha))
    ours_bleu = bleu(ours, refs).score
    plain_bleu, ranked_bleu = bleu(plain, refs).score, bleu(ranked, refs).score
    return {
        "beam": len(nbest[0]) if nbest else 0,
        "length_penalty": alpha,
        "bleu_nmt": round(ours_bleu, 2),
        "bleu_transformers": round(plain_bleu, 2),
        "gap": round(abs(ours_bleu - plain_bleu), 2),
        "identical_outputs": sum(a == b for a, b in zip(ours, plain, strict=True)),
        "bleu_reranked": round(ranked_bleu, 2),
        "gap_reranked": round(abs(ours_bleu - ranked_bleu), 2),
        "identical_reranked": sum(a == b for a, b in zip(ours, ranked, strict=True)),
        "wanted": BLEU_GAP,
        "ok": abs(ours_bleu - ranked_bleu) <= BLEU_GAP,
    }


def test_sets(trained: Trained) -> list[tuple[str, str, int | None, EvalSet]]:
    """What the checks decode: the run's first test set, as (label, text put before each
    source, the forced first output token or None, set); a multilingual run's in each trained
    direction, with the language codes (:func:`nmt.ship.hf.marian_code`) as a user writes
    them."""
    data_cfg, tokenizers = trained.cfg.data, trained.tokenizers
    directions = directions_of(data_cfg)
    if not directions:
        test = load_test_sets(data_cfg, tokenizers, multi30k_source())[0]
        return [(test.name, "", None, test)]
    placement, tags = placement_of(data_cfg), tokenizers.src.tags
    codes = hf.language_codes(trained.cfg, tokenizers.src)
    sets = []
    for d in directions:
        (split,) = resolve_direction_splits(data_cfg, [data_cfg.test[0]], [d], multi30k_source())
        src, refs = (strip_lines(x) for x in read_parallel(split.src_path, split.tgt_path))
        src_tag = tags[d.src] if placement == "both" else None
        data = tagged_dataset(tokenizers, src, refs, tags[d.tgt], placement, src_tag)
        first = first_source_token(placement, tags[d.tgt], src_tag)
        prefix = "" if first is None else f"{codes[first]} "
        forced = None if placement == "source" else tags[d.tgt]
        name = f"{split.set_name}.{d}"
        sets.append((name, prefix, forced, EvalSet(name, src, refs, data)))
    return sets


def check(
    trained: Trained,
    folder: Path,
    limit: int = 0,
    beam: int | None = None,
    generate: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The three parity checks of ``folder`` (the export of ``trained``) on the run's first
    test set (its first ``limit`` sentences when > 0), in every direction of a multilingual
    run. ``generate``: settings of transformers' beam search (``length_penalty``,
    ``early_stopping``) that replace the folder's generation config in the beam check; our
    penalty's alpha, the run's, ranks the re-ranked output."""
    transformers = hf.require()
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(folder)).float().eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    sets = test_sets(trained)
    reports = {}
    for label, prefix, forced, test in sets:
        reports[label] = check_set(
            trained, model, tok, test, (prefix, forced), limit, beam, generate
        )
        reports[label]["folder"] = str(folder)
    if not directions_of(trained.cfg.data):
        return reports[sets[0][0]]
    return {"folder": str(folder), "directions": reports,
            "ok": all(r["ok"] for r in reports.values())}  # fmt: skip


def check_set(
    trained: Trained,
    model: Any,
    tok: Any,
    test: EvalSet,
    language: tuple[str, int | None],
    limit: int,
    beam: int | None,
    generate: dict[str, Any] | None,
) -> dict[str, Any]:
    """:func:`check` on one test set; ``language``: the text put before each source given to
    transformers, and the first output token it forces (or None)."""
    cpu = torch.device("cpu")
    prefix, forced = language
    options = {} if forced is None else {"forced_bos_token_id": forced}

    def body(tokens: list[int]) -> list[int]:  # our output without the forced tag
        return tokens[1:] if forced is not None and tokens[:1] == [forced] else tokens

    n = len(test) if limit <= 0 else min(limit, len(test))
    sources, refs = [prefix + s for s in test.src_text[:n]], test.ref_text[:n]
    run_opts = DecodeOptions.of_run(decode_defaults(trained))
    beam = beam or max(run_opts.beam, 2)
    greedy = DecodeOptions(beam=1, length_penalty=run_opts.length_penalty, precision="32")
    caps = greedy.caps(test.data.src_lens[:n] + 1, trained.model.max_positions)
    caps = (caps + int(forced is not None)).tolist()  # the tag is one token more
    report: dict[str, Any] = {"test_set": test.name, "sentences": n}

    start = time.perf_counter()
    ours = [h.tokens for h in decode_dataset(trained.model, test.data, greedy, cpu, n)]
    theirs = hf_generate(model, tok, sources, caps, 64, num_beams=1, do_sample=False, **options)
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    report["greedy"] = {
        "identical": same,
        "share": same / n,
        "wanted": GREEDY_SHARE,
        "ok": same / n >= GREEDY_SHARE,
        "seconds": round(time.perf_counter() - start, 1),
    }

    start = time.perf_counter()
    wide = DecodeOptions(beam=beam, length_penalty=run_opts.length_penalty, precision="32")
    ours_beam = decode_dataset(trained.model, test.data, wide, cpu, n)
    report["beam"] = beam_report(
        [trained.tokenizers.tgt.decode(body(h.tokens)) for h in ours_beam],
        hf_nbest(model, tok, sources, caps, 16, beam, **options, **(generate or {})),
        lambda tokens: tok.batch_decode(tokens, skip_special_tokens=True),
        refs,
        wide.length_penalty,
    )
    report["beam"]["generate"] = {
        "length_penalty": model.generation_config.length_penalty,
        "early_stopping": model.generation_config.early_stopping,
        **(generate or {}),
    }
    report["beam"]["seconds"] = round(time.perf_counter() - start, 1)

    start = time.perf_counter()
    texts, how = user_texts(model, tok, sources, caps, **options)
    ours_greedy = [trained.tokenizers.tgt.decode(body(t)) for t in ours]
    equal = sum(a == b for a, b in zip(ours_greedy, texts, strict=True))
    report["strings"] = {
        "how": how,
        "identical": equal,
        # MarianTokenizer strips the decoded text; ours keeps spaces that pieces of a degenerate
        # output (only word-boundary pieces, say) decode to
        "identical_but_outer_spaces": sum(
            a.strip() == b for a, b in zip(ours_greedy, texts, strict=True)
        ),
        "share": equal / n,
        "ok": equal / n >= GREEDY_SHARE,
        "seconds": round(time.perf_counter() - start, 1),
    }
    report["ok"] = all(report[k]["ok"] for k in ("greedy", "beam", "strings"))
    return report


def check_run(
    ckpt: Path,
    folder: Path | None = None,
    limit: int = 0,
    beam: int | None = None,
    generate: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Export checkpoint ``ckpt`` (unless ``folder`` holds its export already) and check it;
    ``generate``: settings that replace the folder's in the beam check (:func:`check`)."""
    trained = load_trained(ckpt, torch.device("cpu"))
    if trained.tokenizers.origin is not None:
        raise ConfigError(
            f"{ckpt}: a run imported from M2M100 or NLLB exports to its folder's tokenizer and "
            "ids, which this check (Marian's tokenizer and ours) does not read; nmt-export "
            "--format hf itself compares that folder's ids and log-probabilities with the run's"
        )
    if folder is not None:
        return check(trained, folder, limit, beam, generate)
    with tempfile.TemporaryDirectory(prefix="nmt-check-hf.") as scratch:
        out = export_hf(ckpt, Path(scratch) / "hf")
        return check(trained, out, limit, beam, generate)

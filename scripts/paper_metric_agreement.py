"""How nmt-eval's papers' metric (BLEU on lowercased, Moses-tokenized text) agrees with the
official Multi30k preprocessing, given a checkout of the multi30k/dataset repository.

References: each language's raw test set (data/task1/raw/<set>.<lang>.gz) put through
nmt.evaluate.metrics.moses_tokenize, line by line against the official
data/task1/tok/<set>.lc.norm.tok.<lang>: the share of identical lines and the BLEU of one
against the other.

A system output (--hyp, detokenized, with --ref and --lang): sacreBLEU's cased BLEU, the
papers' metric as nmt-eval reports it, and the same tokenized hypotheses scored against the
official tokenized references; where Perl and the repository's Moses scripts are at hand, also
the hypotheses put through those scripts (lowercase.perl | normalize-punctuation.perl |
tokenizer.perl, as scripts/task1-tokenize.sh did) and scored against the official files.

    python scripts/paper_metric_agreement.py DATASET_CHECKOUT [--set test_2016_flickr] \\
        [--hyp out.hyp --ref out.ref --lang en]
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import subprocess
import sys
from pathlib import Path

from sacrebleu.metrics import BLEU

from nmt.evaluate.metrics import bleu, moses_tokenize, paper_bleu

LANGS = ("cs", "de", "en", "fr")
MOSES = "scripts/moses-3a0631a/tokenizer"
TOKENIZED = BLEU(tokenize="none", force=True)  # on tokens as they are, as multi-bleu.perl


def lines(path: Path) -> list[str]:
    data = path.read_bytes()
    data = gzip.decompress(data) if path.suffix == ".gz" else data
    return data.decode("utf-8").splitlines()


def official(dataset: Path, name: str, lang: str) -> list[str]:
    return lines(dataset / "data" / "task1" / "tok" / f"{name}.lc.norm.tok.{lang}")


def perl_tokenize(dataset: Path, text: list[str], lang: str) -> list[str] | None:
    """The official pipeline on ``text``, or None without Perl or the scripts."""
    moses = dataset / MOSES
    if shutil.which("perl") is None or not (moses / "tokenizer.perl").is_file():
        return None
    steps = [["lowercase.perl"], ["normalize-punctuation.perl", "-l", lang],
             ["tokenizer.perl", "-l", lang, "-threads", "1"]]  # fmt: skip
    data = "".join(line + "\n" for line in text).encode("utf-8")
    for script, *args in steps:
        data = subprocess.run(["perl", str(moses / script), *args], input=data,
                              capture_output=True, check=True, timeout=600).stdout  # fmt: skip
    return data.decode("utf-8").splitlines()


def references(dataset: Path, name: str) -> None:
    print(f"| {name} | language | identical lines | BLEU (ours against official) |")
    print("|---|---|---|---|")
    for lang in LANGS:
        raw = dataset / "data" / "task1" / "raw" / f"{name}.{lang}.gz"
        if not raw.is_file():
            continue
        ours, theirs = moses_tokenize(lines(raw), lang), official(dataset, name, lang)
        same = sum(a == b for a, b in zip(ours, theirs, strict=True))
        score = TOKENIZED.corpus_score(ours, [theirs]).score
        print(f"| | {lang} | {same}/{len(theirs)} ({100 * same / len(theirs):.1f}%) | "
              f"{score:.2f} |")  # fmt: skip


def system(dataset: Path, name: str, hyp: Path, ref: Path, lang: str) -> None:
    hyps, refs, theirs = lines(hyp), lines(ref), official(dataset, name, lang)
    tokens = moses_tokenize(hyps, lang)
    print(f"{hyp} ({lang}, {len(hyps)} sentences)")
    print(f"  sacreBLEU, cased, 13a:                           {bleu(hyps, refs).score:.2f}")
    ours = paper_bleu(tokens, moses_tokenize(refs, lang), lang).score
    print(f"  papers' metric (nmt-eval bleu_paper):            {ours:.2f}")
    against = TOKENIZED.corpus_score(tokens, [theirs]).score
    print(f"  same hypotheses, official references:            {against:.2f}")
    perl = perl_tokenize(dataset, hyps, lang)
    if perl is not None:
        score = TOKENIZED.corpus_score(perl, [theirs]).score
        same = sum(a == b for a, b in zip(tokens, perl, strict=True))
        print(f"  Moses Perl hypotheses, official references:      {score:.2f}")
        print(f"  hypotheses tokenized alike by both:              {same}/{len(hyps)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dataset", type=Path, help="a checkout of multi30k/dataset")
    parser.add_argument("--set", default="test_2016_flickr", help="the split's name")
    parser.add_argument("--hyp", type=Path, help="a detokenized system output")
    parser.add_argument("--ref", type=Path, help="its raw references (nmt-eval's .ref)")
    parser.add_argument("--lang", choices=LANGS, help="the output's language")
    args = parser.parse_args(argv)
    if args.hyp is not None and (args.ref is None or args.lang is None):
        parser.error("--hyp needs --ref and --lang")
    references(args.dataset, args.set)
    if args.hyp is not None:
        system(args.dataset, args.set, args.hyp, args.ref, args.lang)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The printed summary of the JoeyNMT comparison (:mod:`benchmarks.joeynmt`): training and
decoding tables with the ratios nmt / JoeyNMT, and the notes that go with them."""

from __future__ import annotations

from typing import Any

from benchmarks.machine import busy_warning
from benchmarks.report import table


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

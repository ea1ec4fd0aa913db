"""BLEU at an equal time budget beside the peers: the quality half of ``make bench-peers``
(:mod:`benchmarks.peers`).

nmt trains its 30-minute CPU preset first (``experiment=cpu_quick``, ``--quality-minutes`` of
training); each peer then trains its own documented recipe, adapted to the same model size
(:data:`RECIPE` of each peer module says from where and what was changed), for the wall-clock
time nmt's whole training process took, validations included. At that deadline the harness
sends the peer the signal its trainer answers by saving (JoeyNMT SIGINT, Marian and Eole
SIGTERM) and waits for it to exit. Every toolkit then decodes test_2016_flickr with beam 5 by
its own translator, and the detokenized outputs are scored here by sacreBLEU (cased 13a BLEU
with a bootstrap interval) and by the paired bootstrap test against nmt's.

Decoding speed comes from the same trained models: each toolkit's translator decodes the test
set with beam 5 and greedy in batches, and its first :data:`SINGLE` sentences one at a time;
nmt and Eole are decoded the same ways by CTranslate2 too, each model converted by its own
toolkit's path (``nmt-export --format ctranslate2``; CTranslate2's Eole converter, decoded by
``eole predict -engine ct2``).
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.peers_common import (
    CT2,
    GRACE_SECONDS,
    NATIVE,
    Command,
    Decoding,
    RecipeJob,
    Workspace,
    failure,
    fresh,
    run,
)
from benchmarks.report import SetupError
from benchmarks.report import say as _say
from nmt.config import BOOTSTRAP_RESAMPLES
from nmt.evaluate.metrics import bleu, paired_bootstrap
from nmt.runtime.device import cpu_model

TEST = "test_2016_flickr"
SINGLE = 100  # test sentences decoded one at a time
REPEATS = 3  # turns of the one-sentence and the SINGLE-sentence processes


def say(msg: str) -> None:
    _say("bench-peers", msg)


def _updates(peer: ModuleType, cmd: Command) -> int | None:
    try:
        windows = peer.parse_train_log(cmd.windows_file.read_text(errors="replace"))
    except (OSError, ValueError):
        return None
    return windows[-1].step


def train_and_decode(
    peer: ModuleType, python: Path, job: RecipeJob, ws: Workspace, stop: bool
) -> dict[str, Any]:
    """One toolkit's budgeted recipe run (stopped at ``job.seconds`` when ``stop``), then its
    :func:`decodings` by its own translator and by every other engine of its ``ENGINES``."""
    fresh(job.work)
    cmd = peer.recipe_command(python, job, ws)
    say(f"{peer.NAME}: training its recipe for {job.seconds / 60:.1f} minutes")
    stop_after = job.seconds if stop else None
    limit = job.seconds + GRACE_SECONDS if stop else 2 * job.seconds + GRACE_SECONDS
    done = run(cmd, limit, stop_after, peer.STOP_SIGNAL)
    if done.rc != 0 and done.signalled is None:
        raise failure(peer.NAME, "training", done.rc, cmd)
    result = {
        "training_seconds": done.seconds,
        "stop_signal_at": done.signalled,
        "exit_code": done.rc,
        "peak_rss_bytes": done.peak_rss_bytes,
        "updates": _updates(peer, cmd),
        **decodings(peer, python, job, ws, NATIVE),
        "recipe": peer.RECIPE,
    }
    add_engines(peer, python, job, ws, result)
    return result


def add_engines(
    peer: ModuleType, python: Path, job: RecipeJob, ws: Workspace, result: dict[str, Any]
) -> None:
    """``result[engine]`` for each engine of the toolkit's ``ENGINES`` besides its own
    translator that ``result`` lacks: its conversion of the trained model, then
    :func:`decodings` by that engine."""
    for engine in peer.ENGINES:
        if engine == NATIVE or engine in result:
            continue
        cmd = peer.convert_command(python, job, ws)
        say(f"{peer.NAME}: converting its model for {engine}")
        done = run(cmd, 3600)
        if done.rc != 0:
            raise failure(peer.NAME, f"converting for {engine}", done.rc, cmd)
        decoded = decodings(peer, python, job, ws, engine)
        result[engine] = {"convert_seconds": done.seconds, **decoded}


def retime_single(
    peer: ModuleType, python: Path, job: RecipeJob, ws: Workspace, result: dict[str, Any]
) -> None:
    """The one-at-a-time timings of a kept toolkit that were taken once, before the two
    processes took :data:`REPEATS` turns (their entries have no ``runs``), taken again, by
    its own translator and by each engine of ``result``."""
    for engine in peer.ENGINES:
        section = result if engine == NATIVE else result.get(engine)
        if section is None:
            continue
        single = section["one_at_a_time"]
        for beam, key in ((5, "beam5"), (1, "greedy")):
            if "runs" not in single[key]:
                single[key] = one_at_a_time(peer, python, job, ws, beam, engine)


def decodings(
    peer: ModuleType, python: Path, job: RecipeJob, ws: Workspace, engine: str
) -> dict[str, Any]:
    """The test set decoded by ``engine`` with beam 5 and greedy, batched, and its first
    :data:`SINGLE` sentences one at a time."""
    decoded = {beam: decode(peer, python, job, ws, beam, engine) for beam in (5, 1)}
    single = {beam: one_at_a_time(peer, python, job, ws, beam, engine) for beam in (5, 1)}
    return {
        "decode_seconds": decoded[5][1],
        "hypotheses": str(decoded[5][0]),
        "greedy": {"decode_seconds": decoded[1][1], "hypotheses": str(decoded[1][0])},
        "one_at_a_time": {"beam5": single[5], "greedy": single[1]},
    }


def decode(
    peer: ModuleType, python: Path, job: RecipeJob, ws: Workspace, beam: int,
    engine: str = NATIVE, src: Path | None = None, one: bool = False,
):  # fmt: skip
    """The toolkit's decoding of ``src`` (the test set) at ``beam`` by ``engine``, in batches
    of one sentence when ``one``: (output file, seconds of the whole process)."""
    src = src or ws.text(TEST, ws.src)
    tag = "" if engine == NATIVE else f".{engine}"
    out = job.work / f"{src.stem}.beam{beam}{tag}{'.one' if one else ''}.hyp"
    dec = peer.decode_command(python, job, ws, Decoding(src, out, beam, one, engine))
    how = f"beam {beam}{'' if engine == NATIVE else ' by ' + engine}"
    say(f"{peer.NAME}: decoding {src.name} with {how}{', one at a time' if one else ''}")
    done = run(dec, 3600)
    if done.rc != 0 or not out.exists():
        raise failure(peer.NAME, "decoding", done.rc, dec)
    return out, done.seconds


def one_at_a_time(
    peer: ModuleType, python: Path, job: RecipeJob, ws: Workspace, beam: int, engine: str
) -> dict[str, Any]:
    """Seconds per sentence decoded one at a time by ``engine``: the first :data:`SINGLE`
    test sentences, less the same process on the first sentence alone (start-up and model
    loading), over the :data:`SINGLE` - 1 sentences between. The two processes take turns
    :data:`REPEATS` times and the median of each is used: the difference is a few seconds
    between processes whose start-up alone varies by about one."""
    lines = ws.text(TEST, ws.src).read_text(encoding="utf-8").splitlines()
    sources = {n: job.work / f"first{n}.{ws.src}" for n in (1, SINGLE)}
    for n, src in sources.items():
        src.write_text("".join(line + "\n" for line in lines[:n]), encoding="utf-8")
    runs: dict[int, list[float]] = {n: [] for n in sources}
    for _ in range(REPEATS):
        for n, src in sources.items():
            runs[n].append(decode(peer, python, job, ws, beam, engine, src, one=True)[1])
    times = {n: statistics.median(seconds) for n, seconds in runs.items()}
    per = (times[SINGLE] - times[1]) / (SINGLE - 1)
    return {"sentences": SINGLE, "seconds": times[SINGLE], "seconds_first": times[1],
            "seconds_per_sentence": per, "runs": {str(n): r for n, r in runs.items()}}  # fmt: skip


def score(results: dict[str, dict[str, Any]], ws: Workspace) -> None:
    """BLEU with its interval for every toolkit's decodings (by its own translator and by
    CTranslate2 where it has that), and the paired test of its own against nmt's."""
    refs = ws.text(TEST, ws.tgt).read_text(encoding="utf-8").splitlines()
    hyps = {}
    for name, r in results.items():
        hyps[name] = _score(name, r, refs)
        if CT2 in r:
            _score(f"{name} by {CT2}", r[CT2], refs)
    others = [n for n in hyps if n != "nmt"]
    if "nmt" in hyps and others:
        _, paired = paired_bootstrap(hyps["nmt"], [hyps[n] for n in others], refs)
        for name, p in zip(others, paired, strict=True):
            results[name]["p_value_against_nmt"] = p.p_value


def _score(name: str, decoded: dict[str, Any], refs: list[str]) -> list[str]:
    """BLEU with its interval of ``decoded``'s beam-5 output, and its greedy output's, written
    into ``decoded``; the beam-5 lines."""
    lines = Path(decoded["hypotheses"]).read_text(encoding="utf-8").splitlines()
    if len(lines) != len(refs):
        raise RuntimeError(f"{name}: {len(lines)} output lines for {len(refs)} references")
    s = bleu(lines, refs, resamples=BOOTSTRAP_RESAMPLES)
    decoded["bleu"] = s.score
    decoded["bleu_ci"] = [s.ci.low, s.ci.high] if s.ci else None
    decoded["signature"] = s.signature
    greedy = Path(decoded["greedy"]["hypotheses"]).read_text(encoding="utf-8")
    decoded["greedy"]["bleu"] = bleu(greedy.splitlines(), refs).score
    return lines


def carried(done: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The toolkits of an earlier run (``done``: its ``quality`` section or its progress
    file) whose outputs are still on disk: kept instead of trained again."""
    if not done:
        return {}
    if done.get("cpu_model") != cpu_model():
        raise SetupError(
            f"the earlier run trained on {done.get('cpu_model')!r}, this machine is "
            f"{cpu_model()!r}: an equal wall-clock budget needs one machine"
        )
    kept = {}
    for name, r in done.get("toolkits", {}).items():
        files = [r.get("hypotheses"), r.get("greedy", {}).get("hypotheses")]
        if all(isinstance(f, str) and Path(f).is_file() for f in files):
            kept[name] = r
    return kept


def write_progress(path: Path, state: dict[str, Any]) -> None:
    """The runs so far, written whole under a temporary name and then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.part")
    part.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(part, path)


def compare_quality(
    minutes: float, threads: int, work: Path, ws: Workspace, kits: dict[str, ModuleType],
    pythons: dict[str, Path], done: dict[str, Any] | None = None, redecode: Sequence[str] = (),
) -> dict[str, Any]:  # fmt: skip
    """nmt's preset for ``minutes`` of training, then each peer for nmt's wall-clock time.

    ``done``: an earlier run's quality section or ``<work>/quality-progress.json`` (written
    after every toolkit): its toolkits whose outputs are still there are kept, with its
    budget, and only the others train; a kept toolkit is decoded by the engines of its
    ``ENGINES`` that it was not decoded by, and its one-at-a-time timings taken before they
    were repeated are taken again (:func:`retime_single`). A long comparison can so be
    finished in parts. A kept toolkit named in ``redecode`` is converted and decoded again,
    every way (after a change to its decoding)."""
    results = carried(done)
    budget = float(done["wall_clock_budget_seconds"]) if "nmt" in results and done else 0.0
    if results:
        say(f"kept from the earlier run: {', '.join(results)}")
    if "nmt" in kits and "nmt" not in results:
        job = RecipeJob(minutes * 60, threads, work / "nmt" / "recipe")
        results["nmt"] = train_and_decode(kits["nmt"], pythons["nmt"], job, ws, stop=False)
        budget = results["nmt"]["training_seconds"]
    progress = work / "quality-progress.json"
    state = {
        "minutes": minutes,
        "wall_clock_budget_seconds": budget,
        "cpu_model": cpu_model(),
        "toolkits": results,
    }
    write_progress(progress, state)
    if not budget:
        raise SetupError("the peers' budget is nmt's wall-clock time: train nmt first")
    for name, peer in kits.items():
        if name in results:  # kept: decoded by the engines it lacks, in its own folder
            job = RecipeJob(budget, threads, Path(results[name]["hypotheses"]).parent)
            if name in redecode:
                for engine in peer.ENGINES:
                    results[name].pop(engine, None)
                results[name].update(decodings(peer, pythons[name], job, ws, NATIVE))
            add_engines(peer, pythons[name], job, ws, results[name])
            retime_single(peer, pythons[name], job, ws, results[name])
        else:
            job = RecipeJob(budget, threads, work / name / "recipe")
            results[name] = train_and_decode(peer, pythons[name], job, ws, stop=True)
        write_progress(progress, state)
    score(results, ws)
    return state

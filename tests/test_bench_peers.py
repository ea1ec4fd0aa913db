"""``make bench-peers``: the windows' figures, JoeyNMT's and nmt's adapters read on recorded
logs, and the rounds run on toolkits made here (real processes whose logs the test knows)."""

from __future__ import annotations

import json
import signal
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from benchmarks import peer_eole, peer_joeynmt, peer_marian, peer_nmt, peers, peers_quality
from benchmarks.peers_common import (
    CT2,
    NATIVE,
    Command,
    Decoding,
    RecipeJob,
    TrainJob,
    Window,
    Workspace,
    steady_windows,
    window_stats,
)
from benchmarks.report import SetupError

DATA = Path(__file__).parent / "data" / "peers"


def test_window_stats_leave_out_the_warm_up_and_take_the_median_window() -> None:
    windows = [Window(5, 5, 10.0, 5000.0), Window(10, 5, 5.0, 5000.0), Window(15, 5, 4.0, 6000.0)]
    assert steady_windows(windows, 5) == windows[1:]
    stats = window_stats(windows, 5)
    assert stats["timed_steps"] == 10 and stats["first_timed_step"] == 6
    assert stats["tgt_tokens_per_s"] == pytest.approx((1000 + 1500) / 2)
    assert stats["tgt_tokens_per_s_overall"] == pytest.approx(11000 / 9)
    assert stats["tgt_tokens_per_step_mean"] == pytest.approx(1100)
    assert stats["step_seconds_median"] == pytest.approx(0.9)
    with pytest.raises(ValueError, match="after the first 15 updates"):
        window_stats(windows, 15)


def test_joeynmt_windows_from_its_timestamps() -> None:
    windows = peer_joeynmt.parse_train_log((DATA / "joeynmt-transformer-fp32.log").read_text())
    assert [(w.step, w.steps) for w in windows] == [(5, 5), (10, 5)]
    # 19:10:11,245 (EPOCH 1) to 19:11:48,593 at 178 tokens/s
    assert windows[0].seconds == pytest.approx(97.348, abs=1e-6)
    assert windows[0].tokens_per_s == pytest.approx(178)
    assert windows[1].seconds == pytest.approx(105.717, abs=1e-6)
    with pytest.raises(ValueError, match="EPOCH 1"):
        peer_joeynmt.parse_train_log("2026-12-06 19:10:11,245 - INFO - joeynmt.training - x\n")


def test_joeynmt_config_points_at_the_workspace_with_token_batches(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    job = TrainJob("gru", "32", 40, 3000, 2, tmp_path / "run", 5, seed=7)
    cmd = peer_joeynmt.train_command(Path("/venv/bin/python"), job, ws)
    assert cmd.argv[:4] == ["/venv/bin/python", "-m", "joeynmt", "train"]
    assert cmd.env["OMP_NUM_THREADS"] == "2" and cmd.windows_file == cmd.log
    cfg = yaml.safe_load(Path(cmd.argv[4]).read_text())
    assert cfg["model"]["encoder"]["rnn_type"] == "gru"
    assert cfg["data"]["train"] == str(ws.root / "data" / "train")
    assert cfg["data"]["trg"]["tokenizer_cfg"]["model_file"] == str(ws.spm_model)
    t = cfg["training"]
    assert (t["updates"], t["logging_freq"], t["random_seed"]) == (40, 5, 7)
    assert t["batch_type"] == "token"
    assert t["batch_size"] == round(3000 * peer_joeynmt.PADDED_PER_TARGET)
    assert t["validation_freq"] > 40


def test_nmt_windows_from_its_train_events() -> None:
    text = (DATA / "nmt-transformer-fp32.metrics.jsonl").read_text()
    windows = peer_nmt.parse_train_log(text)
    first = json.loads(text.splitlines()[1])
    assert windows[0] == Window(5, 5, first["seconds"], first["tokens"])
    assert [w.step for w in windows] == [5, 10]
    cmd = Command([], DATA, DATA, windows_from=DATA / "nmt-transformer-fp32.metrics.jsonl")
    assert peer_nmt.run_details(cmd) == {"trained_in": "32"}
    with pytest.raises(ValueError, match="line 2: not JSON"):
        peer_nmt.parse_train_log('{"event": "start"}\n{"event": "train", \n')
    with pytest.raises(ValueError, match="no 'train' event"):
        peer_nmt.parse_train_log('{"event": "start"}\n')


def test_nmt_command_sets_the_batch_updates_and_no_validation(tmp_path: Path) -> None:
    job = TrainJob("gru", "bf16", 60, 3500, 2, tmp_path / "run", 5)
    cmd = peer_nmt.train_command(Path("/v/bin/python"), job, Workspace(tmp_path, Path("/d")))
    assert cmd.argv[0] == "/v/bin/nmt-train"
    assert {
        "model=gru_bahdanau",
        "data.root=/d",
        f"data.max_tokens={round(3500 * peer_nmt.BUDGET_PER_TARGET)}",
        "trainer.precision=bf16",
        "trainer.max_steps=60",
        "trainer.log_every=5",
        f"hydra.run.dir={tmp_path / 'run' / 'run'}",
    } <= set(cmd.argv)
    assert cmd.windows_file == tmp_path / "run" / "run" / "metrics.jsonl"


# ------------------------------------------------------------------------------ the rounds

FAKE = """
import json, sys
asked, steps, every, seconds_per_update, share = (float(x) for x in sys.argv[1:6])
order = sys.argv[6]
with open(order, "a") as f:
    f.write(sys.argv[7] + "\\n")
for step in range(int(every), int(steps) + 1, int(every)):
    print(json.dumps([step, every, every * seconds_per_update, every * asked * share]))
"""


def fake_toolkit(name: str, seconds_per_update: float, share: float, order: Path):
    """A toolkit that trains ``share`` of the target tokens it is asked for, at a fixed
    number of seconds per update, and notes when it ran."""

    def train_command(python: Path, job: TrainJob, ws: Workspace) -> Command:
        script = job.work / "fake.py"
        script.write_text(FAKE)
        args = [job.tgt_tokens_per_step, job.steps, job.log_every, seconds_per_update, share]
        tag = f"{name}:{job.precision}:{job.steps}"
        return Command(
            [python, str(script), *map(str, args), str(order), tag], job.work, job.work / "log"
        )

    def parse_train_log(text: str) -> list[Window]:
        return [Window(*json.loads(line)) for line in text.splitlines()]

    return SimpleNamespace(
        NAME=name,
        PRECISIONS={"transformer": ("32", "bf16", "auto") if name == "nmt" else ("32",)},
        DIFFERENCES={"transformer": [f"{name} differs"]},
        train_command=train_command,
        parse_train_log=parse_train_log,
    )


def settings(tmp_path: Path, **changes) -> peers.Settings:
    base = dict(
        peers=["slow"],
        models=["transformer"],
        precisions=["32", "bf16", "auto"],
        rounds=2,
        steps=20,
        skip=5,
        log_every=5,
        tgt_tokens=1000,
        calibrate_steps=4,
        threads=1,
        venvs=tmp_path / "venvs",
        work=tmp_path / "work",
        data_root=tmp_path / "data",
        timeout=60,
        out=tmp_path / "out.json",
        python=Path(sys.executable),
    )
    return peers.Settings(**{**base, **changes})


def test_rounds_calibrate_each_batch_and_rotate_the_order(tmp_path: Path) -> None:
    order = tmp_path / "order.txt"
    kits = {
        "nmt": fake_toolkit("nmt", 0.5, 0.8, order),
        "slow": fake_toolkit("slow", 2.0, 0.5, order),
    }
    s = settings(tmp_path)
    py = Path(sys.executable)
    out = peers.compare_training(s, Workspace(tmp_path), kits, {"nmt": py, "slow": py})
    entry = out["transformer"]
    # each toolkit is asked for what brings it to 1,000 target tokens per update
    assert entry["asked_tgt_tokens"] == {"nmt": 1250, "slow": 2000}
    nmt, slow = entry["toolkits"]["nmt"], entry["toolkits"]["slow"]
    assert nmt["32"]["tgt_tokens_per_step_mean"] == pytest.approx(1000)
    assert slow["32"]["tgt_tokens_per_step_mean"] == pytest.approx(1000)
    assert nmt["bf16"]["tgt_tokens_per_s"] == pytest.approx(2000)
    assert slow["32"]["tgt_tokens_per_s"] == pytest.approx(500)
    assert "bf16" not in slow and len(slow["32"]["rounds"]) == 2
    assert entry["ratios"]["slow"] == {
        "32": pytest.approx(4.0),
        "best": pytest.approx(4.0),
        "auto": pytest.approx(4.0),
    }
    assert entry["differences"]["slow"] == ["slow differs"]
    ran = order.read_text().split()
    # two calibrations, then round 1 nmt first, round 2 the peer first
    assert ran == [
        "nmt:32:4",
        "slow:32:4",
        "nmt:32:20",
        "nmt:bf16:20",
        "nmt:auto:20",
        "slow:32:20",
        "slow:32:20",
        "nmt:32:20",
        "nmt:bf16:20",
        "nmt:auto:20",
    ]
    text = peers.report({"train": out, "machine": {}})
    assert "transformer: nmt's auto / slow's faster: 4.00x" in text


def test_a_failing_toolkit_names_its_command_and_log(tmp_path: Path) -> None:
    def train_command(python: Path, job: TrainJob, ws: Workspace) -> Command:
        code = "import sys; print('bad option --foo'); sys.exit(3)"
        return Command([str(python), "-c", code], job.work, job.work / "log")

    kit = SimpleNamespace(NAME="broken", train_command=train_command)
    job = TrainJob("transformer", "32", 10, 1000, 1, tmp_path / "w")
    with pytest.raises(RuntimeError, match=r"broken failed \(exit 3\).*\n.*bad option --foo"):
        peers.segment(kit, Path(sys.executable), job, Workspace(tmp_path), settings(tmp_path), 0)


def test_settings_problems_are_named(tmp_path: Path) -> None:
    s = settings(tmp_path, peers=["fairseq"], precisions=["16"], steps=5, skip=5)
    problems = "\n".join(peers.check_settings(s))
    assert "--peers fairseq: choose among eole, marian, joeynmt" in problems
    assert "--precision 16" in problems
    assert "--steps 5 leave no log window after --skip 5" in problems
    kept = {"toolkits": {"nmt": {}, "eole": {}}}
    s = settings(tmp_path, quality_done=kept, quality_redecode=["nmt", "marian"])
    problems = "\n".join(peers.check_settings(s))
    assert (
        "--quality-redecode nmt,marian: only toolkits kept by --quality-continue (nmt, eole)"
        in problems
    )
    ok = settings(tmp_path, peers=["eole"], quality_done=kept, quality_redecode=["nmt"])
    assert not peers.check_settings(ok)


# ------------------------------------------------------------------------------ equal budget

TRAINER = """
import signal, sys, time
stop_by_itself, work = float(sys.argv[1]), sys.argv[2]
def saved(*_):
    open(work + "/saved", "w").write("yes")
    sys.exit(0)
signal.signal(signal.SIGTERM, saved)
tic = time.time()
while stop_by_itself == 0 or time.time() - tic < stop_by_itself:
    time.sleep(0.05)
open(work + "/saved", "w").write("by itself")
"""
DECODER = """
import sys
src, out, ws, how = sys.argv[1:5]
refs = open(ws + "/data/test_2016_flickr.en").read().splitlines()
lines = refs if how == "copy" else [r.rsplit(" ", 1)[0] for r in refs]
open(out, "w").write("".join(line + "\\n" for line in lines))
"""


def recipe_toolkit(name: str, stop_by_itself: float, how: str, engines=(NATIVE,)):
    def recipe_command(python: Path, job, ws: Workspace) -> Command:
        script = job.work / "train.py"
        script.write_text(TRAINER)
        argv = [str(python), str(script), str(stop_by_itself), str(job.work)]
        return Command(argv, job.work, job.work / "train.log")

    def convert_command(python: Path, job, ws: Workspace) -> Command:
        argv = [str(python), "-c", f"open({str(job.work / 'converted')!r}, 'w')"]
        return Command(argv, job.work, job.work / "convert.log")

    def decode_command(python: Path, job, ws: Workspace, d: Decoding) -> Command:
        src, out, beam = d.src, d.out, d.beam
        assert d.engine in engines
        if d.engine != NATIVE:  # the engine decodes the converted model
            assert (job.work / "converted").exists()
        script = job.work / "decode.py"
        script.write_text(DECODER)
        decoded = how if beam == 5 else "cut"
        argv = [str(python), str(script), str(src), str(out), str(ws.root), decoded]
        return Command(argv, job.work, job.work / "decode.log")

    def parse_train_log(text: str) -> list[Window]:
        raise ValueError("no windows")

    return SimpleNamespace(
        NAME=name,
        RECIPE={"source": name},
        STOP_SIGNAL=None if stop_by_itself else signal.SIGTERM,
        ENGINES=engines,
        recipe_command=recipe_command,
        convert_command=convert_command,
        decode_command=decode_command,
        parse_train_log=parse_train_log,
    )


def make_test_set(tmp_path: Path, sentences: int) -> Workspace:
    """A workspace holding only a test set of ``sentences`` lines."""
    ws = Workspace(tmp_path / "ws")
    (ws.root / "data").mkdir(parents=True)
    refs = [f"a man rides a red bike number {i} today" for i in range(sentences)]
    ws.text("test_2016_flickr", "en").write_text("".join(r + "\n" for r in refs))
    ws.text("test_2016_flickr", "de").write_text("".join(f"x {i}\n" for i in range(sentences)))
    return ws


def test_peers_get_nmts_wall_clock_then_their_outputs_are_scored(tmp_path: Path) -> None:
    ws = make_test_set(tmp_path, 40)
    kits = {
        "nmt": recipe_toolkit("nmt", 1.5, "copy", (NATIVE, CT2)),
        "peer": recipe_toolkit("peer", 0, "cut"),
    }
    py = Path(sys.executable)
    out = peers_quality.compare_quality(
        0.01, 1, tmp_path / "work", ws, kits, {"nmt": py, "peer": py}
    )
    nmt, peer = out["toolkits"]["nmt"], out["toolkits"]["peer"]
    # nmt ran its own 1.5 s (past its 0.6 s budget: it stops by itself); the peer got as long
    assert nmt["stop_signal_at"] is None and nmt["training_seconds"] >= 1.5
    assert out["wall_clock_budget_seconds"] == nmt["training_seconds"]
    assert peer["stop_signal_at"] == pytest.approx(nmt["training_seconds"], abs=0.6)
    assert (tmp_path / "work" / "peer" / "recipe" / "saved").read_text() == "yes"
    assert nmt["bleu"] == pytest.approx(100.0) and nmt["greedy"]["bleu"] < 100.0
    assert nmt["greedy"]["hypotheses"].endswith("test_2016_flickr.beam1.hyp")
    single = nmt["one_at_a_time"]["beam5"]
    for n in ("1", str(peers_quality.SINGLE)):  # the processes took turns; medians are used
        assert len(single["runs"][n]) == peers_quality.REPEATS
    assert single["seconds"] == statistics.median(single["runs"][str(peers_quality.SINGLE)])
    assert single["seconds_first"] == statistics.median(single["runs"]["1"])
    assert single["sentences"] == peers_quality.SINGLE
    assert single["seconds_per_sentence"] == pytest.approx(
        (single["seconds"] - single["seconds_first"]) / (peers_quality.SINGLE - 1)
    )
    first = tmp_path / "work" / "nmt" / "recipe" / "first1.de"
    assert first.read_text() == "x 0\n"
    assert peer["bleu"] < 100.0 and peer["p_value_against_nmt"] < 0.05
    assert peer["updates"] is None and peer["recipe"] == {"source": "peer"}
    # nmt's model converted, then decoded by CTranslate2 the same ways; the peer has no engine
    ct2 = nmt[CT2]
    assert ct2["convert_seconds"] > 0 and ct2["bleu"] == pytest.approx(100.0)
    assert ct2["hypotheses"].endswith("test_2016_flickr.beam5.ctranslate2.hyp")
    assert ct2["greedy"]["hypotheses"].endswith("test_2016_flickr.beam1.ctranslate2.hyp")
    assert ct2["greedy"]["bleu"] == nmt["greedy"]["bleu"]
    assert ct2["one_at_a_time"]["greedy"]["sentences"] == peers_quality.SINGLE
    assert CT2 not in peer
    report = peers.quality_report(out)
    assert "p vs nmt" in report
    rows = [line.split(" | ")[:2] for line in report.splitlines() if " | " in line]
    engines = [[c.strip() for c in r] for r in rows if r[1].strip() in (NATIVE, CT2)]
    assert engines == [["nmt", NATIVE], ["nmt", CT2], ["peer", NATIVE]]


@pytest.mark.parametrize("peer", [peer_eole, peer_marian, peer_joeynmt, peer_nmt])
def test_each_recipe_writes_its_config_and_decodes_the_test_set(peer, tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws", Path("/d"))
    ws.spm_model.parent.mkdir(parents=True)
    ws.spm_model.write_bytes(b"model")
    (ws.root / "data").mkdir()
    ws.text("train", "de").write_text("a\nb\n")
    job = RecipeJob(1800, 2, tmp_path / "run")
    cmd = peer.recipe_command(Path("/v/bin/python"), job, ws)
    assert cmd.cwd == job.work and cmd.env["OMP_NUM_THREADS"] == "2"
    assert peer.RECIPE["source"] and peer.RECIPE["adapted"]
    if peer is peer_eole:  # decodes the newest checkpoint whose config.json was written
        for step in ("step_50", "step_100", "step_150"):
            (job.work / "model" / step).mkdir(parents=True)
        for step in ("step_50", "step_100"):
            (job.work / "model" / step / "config.json").write_text("{}")
    src, out = ws.text("test_2016_flickr", "de"), job.work / "hyp"
    dec = peer.decode_command(Path("/v/bin/python"), job, ws, Decoding(src, out))
    argv = " ".join(dec.argv)
    assert str(src) in argv + str(dec.stdin) and str(out) in argv + str(dec.stdout)
    if peer is peer_eole:
        assert "step_100" in argv and "-transforms sentencepiece" in argv
        assert "-beam_size 5" in argv
    if peer is peer_marian:
        assert "-b 5" in argv and "-n 1.0" in argv
        assert json.loads((job.work / "recipe.yml").read_text())["task"] == (
            "transformer-base-prenorm"
        )
    if peer is peer_joeynmt:
        testing = yaml.safe_load((job.work / "recipe.yaml").read_text())["testing"]
        assert testing["beam_size"] == 5
    if peer is peer_nmt:
        assert "experiment=cpu_quick" in cmd.argv and "trainer.max_time=1800" in cmd.argv
    python = Path("/v/bin/python")
    greedy = " ".join(peer.decode_command(python, job, ws, Decoding(src, out, 1)).argv)
    one = peer.decode_command(python, job, ws, Decoding(src, out, 5, True))
    batch_of_one = {
        peer_eole: "-batch_size 1 -batch_type sents",
        peer_marian: "--mini-batch 1 --maxi-batch 1",
        peer_nmt: "max_tokens=1",
        peer_joeynmt: "recipe-beam5-one.yaml",
    }
    assert batch_of_one[peer] in " ".join(one.argv)
    assert batch_of_one[peer] not in argv
    expected = {
        peer_eole: "-beam_size 1",
        peer_marian: "-b 1 ",
        peer_nmt: "beam=1",
        peer_joeynmt: "recipe-beam1.yaml",
    }
    assert expected[peer] in greedy
    if peer is peer_joeynmt:
        testing = yaml.safe_load((job.work / "recipe-beam1.yaml").read_text())["testing"]
        assert testing["beam_size"] == 1
        testing = yaml.safe_load((job.work / "recipe-beam5-one.yaml").read_text())["testing"]
        assert (testing["beam_size"], testing["batch_size"]) == (5, 1)


def test_nmt_and_eole_decode_their_own_ctranslate2_conversions(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws", Path("/d"))
    job = RecipeJob(1800, 2, tmp_path / "run")
    python = Path("/v/bin/python")
    src, out = ws.text("test_2016_flickr", "de"), job.work / "hyp"
    conv = peer_nmt.convert_command(python, job, ws).argv
    assert conv[:2] == ["/v/bin/nmt-export", str(job.work / "run")]
    assert "--format ctranslate2" in " ".join(conv)
    package = conv[conv.index("--out") + 1]
    ct2 = peer_nmt.decode_command(python, job, ws, Decoding(src, out, engine=CT2)).argv
    assert f"model={package}" in ct2 and "engine=ctranslate2" in ct2
    assert not [a for a in ct2 if a.startswith("run=")]
    native = peer_nmt.decode_command(python, job, ws, Decoding(src, out)).argv
    assert "engine=torch" in native and f"run={job.work / 'run'}" in native
    # Eole: CTranslate2's converter writes into the newest checkpoint, where -engine ct2 looks
    for step in ("step_50", "step_100"):
        (job.work / "model" / step).mkdir(parents=True)
        (job.work / "model" / step / "config.json").write_text("{}")
    conv = peer_eole.convert_command(python, job, ws).argv
    assert conv[:3] == ["/v/bin/python", "-m", "ctranslate2.converters.eole_ct2"]
    newest = job.work / "model" / "step_100"
    assert conv[conv.index("--model_path") + 1] == str(newest)
    assert conv[conv.index("--output_dir") + 1] == str(newest / peer_eole.CT2_DIR)
    assert conv[conv.index("--quantization") + 1] == "float32"
    greedy = Decoding(src, out, 1, engine=CT2)
    ct2 = " ".join(peer_eole.decode_command(python, job, ws, greedy).argv)
    assert f"-model_path {newest} -engine ct2 -top_k 1 " in ct2 and "-beam_size 1" in ct2
    native = " ".join(peer_eole.decode_command(python, job, ws, Decoding(src, out)).argv)
    assert "-engine" not in native and "-top_k" not in native
    assert peer_nmt.ENGINES == peer_eole.ENGINES == (NATIVE, CT2)
    assert peer_marian.ENGINES == peer_joeynmt.ENGINES == (NATIVE,)


def test_marian_lines_of_a_mean_cost_carry_no_label_counts() -> None:
    # the recipe's ce-mean-words log (pymarian 1.12.42): the rate times the seconds
    text = (
        "[2026-12-06 20:15:41] Ep. 1 : Up. 50 : Sen. 10,789 : Cost 8.19414139 : Time 83.48s "
        ": 2104.76 words/s : gNorm 1.6743\n"
        "[2026-12-06 20:17:03] Ep. 1 : Up. 100 : Sen. 22,468 : Cost 6.17278290 : Time 82.03s "
        ": 2125.31 words/s : gNorm 1.2379\n"
    )
    windows = peer_marian.parse_train_log(text)
    assert [(w.step, w.steps) for w in windows] == [(50, 50), (100, 50)]
    assert windows[1].tgt_tokens == pytest.approx(2125.31 * 82.03)


def test_an_equal_budget_comparison_continues_from_its_progress_file(tmp_path: Path) -> None:
    ws = make_test_set(tmp_path, 30)
    py = Path(sys.executable)
    pythons = {"nmt": py, "peer": py, "late": py}
    work = tmp_path / "work"
    kits = {"nmt": recipe_toolkit("nmt", 1.0, "copy"), "peer": recipe_toolkit("peer", 0, "cut")}
    first = peers_quality.compare_quality(0.01, 1, work, ws, kits, pythons)
    progress = json.loads((work / "quality-progress.json").read_text())
    assert set(progress["toolkits"]) == {"nmt", "peer"}

    def never(*args):
        raise AssertionError("a kept toolkit was trained again")

    kept_nmt = SimpleNamespace(**{**vars(kits["nmt"]), "recipe_command": never})
    Path(first["toolkits"]["peer"]["hypotheses"]).unlink()  # its outputs are gone: retrained
    kits = {"nmt": kept_nmt, "peer": kits["peer"], "late": recipe_toolkit("late", 0, "cut")}
    again = peers_quality.compare_quality(0.01, 1, work, ws, kits, pythons, progress)
    assert again["wall_clock_budget_seconds"] == first["wall_clock_budget_seconds"]
    assert set(again["toolkits"]) == {"nmt", "peer", "late"}
    assert again["toolkits"]["late"]["stop_signal_at"] == pytest.approx(
        first["wall_clock_budget_seconds"], abs=0.6
    )
    assert again["toolkits"]["nmt"]["bleu"] == pytest.approx(100.0)
    assert CT2 not in again["toolkits"]["nmt"]
    # a kept toolkit whose module now lists another engine: converted and decoded by it only
    progress = json.loads((work / "quality-progress.json").read_text())
    with_ct2 = recipe_toolkit("nmt", 1.0, "copy", (NATIVE, CT2))
    kits["nmt"] = SimpleNamespace(**{**vars(with_ct2), "recipe_command": never})
    native = again["toolkits"]["nmt"]["decode_seconds"]
    third = peers_quality.compare_quality(0.01, 1, work, ws, kits, pythons, progress)
    assert third["toolkits"]["nmt"][CT2]["bleu"] == pytest.approx(100.0)
    assert third["toolkits"]["nmt"]["decode_seconds"] == native
    assert (work / "nmt" / "recipe" / "converted").exists()
    # one-at-a-time timings taken once (before the turns) are taken again; the rest are kept
    progress = json.loads((work / "quality-progress.json").read_text())
    old = {"sentences": 100, "seconds": 9.0, "seconds_first": 1.0, "seconds_per_sentence": 0.08}
    progress["toolkits"]["nmt"][CT2]["one_at_a_time"]["greedy"] = old
    progress["toolkits"]["peer"]["one_at_a_time"]["beam5"] = old
    kept = json.loads(json.dumps(progress["toolkits"]["nmt"]["one_at_a_time"]))
    fourth = peers_quality.compare_quality(0.01, 1, work, ws, kits, pythons, progress)
    for single in (
        fourth["toolkits"]["nmt"][CT2]["one_at_a_time"]["greedy"],
        fourth["toolkits"]["peer"]["one_at_a_time"]["beam5"],
    ):
        assert len(single["runs"][str(peers_quality.SINGLE)]) == peers_quality.REPEATS
        assert single["seconds"] != old["seconds"]
    assert fourth["toolkits"]["nmt"]["one_at_a_time"] == kept
    assert fourth["toolkits"]["peer"]["one_at_a_time"]["greedy"]["runs"]
    # a kept toolkit named for it is converted and decoded again, every way; the others stay
    progress = json.loads((work / "quality-progress.json").read_text())
    (work / "nmt" / "recipe" / "converted").unlink()
    peer_before = progress["toolkits"]["peer"]["decode_seconds"]
    before = json.loads(json.dumps(progress["toolkits"]["nmt"]))
    fifth = peers_quality.compare_quality(0.01, 1, work, ws, kits, pythons, progress, ["nmt"])
    nmt = fifth["toolkits"]["nmt"]
    assert (work / "nmt" / "recipe" / "converted").exists()
    assert nmt["decode_seconds"] != before["decode_seconds"]
    assert nmt[CT2]["decode_seconds"] != before[CT2]["decode_seconds"]
    assert nmt["bleu"] == pytest.approx(100.0) and nmt[CT2]["bleu"] == pytest.approx(100.0)
    assert fifth["toolkits"]["peer"]["decode_seconds"] == peer_before
    elsewhere = {**progress, "cpu_model": "another CPU"}
    with pytest.raises(SetupError, match="'another CPU'.*needs one machine"):
        peers_quality.compare_quality(0.01, 1, work, ws, kits, pythons, elsewhere)

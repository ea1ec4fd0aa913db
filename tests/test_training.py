"""The training loop: exact resume, accumulation, non-finite updates, signals, schedules."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException

from nmt.config import ConfigError
from nmt.config_checks import check_train_config
from nmt.store.checkpoint import load_checkpoint
from nmt.store.paths import checkpoint_path
from nmt.train import optim
from nmt.train.command import train
from nmt.train.loop import Checkpointer
from nmt.train.runlog import of_kind, read_events, summarize
from nmt.train.step import loss_sum, train_step
from nmt.train.validation import validation_scores

from .helpers import REPO, compose_config, tiny_run_overrides


def run(corpus, tmp_path, name, *extra):
    cfg = compose_config("train", tiny_run_overrides(corpus, tmp_path, *extra))
    return train(cfg, tmp_path / "outputs" / "runs" / name)


def weights(run_dir, name="last.pt"):
    return load_checkpoint(run_dir / "checkpoints" / name)["model"]


def test_resume_equals_uninterrupted_run_bit_for_bit(corpus, tmp_path):
    common = ("trainer.val_every=6", "model.dropout=0.1", "trainer.seed=7")
    full = run(corpus, tmp_path, "full", "trainer.max_steps=18", *common)
    half = run(corpus, tmp_path, "half", "trainer.max_steps=9", *common)
    assert half["state"]["step"] == 9
    half_dir = tmp_path / "outputs" / "runs" / "half"
    resumed = run(
        corpus, tmp_path, "ignored", "trainer.max_steps=18", f"trainer.resume={half_dir}", *common
    )
    assert resumed["run_dir"] == str(half_dir.resolve())  # continued in place
    assert resumed["state"]["step"] == 18
    assert resumed["state"]["epoch"] == full["state"]["epoch"]
    again = run(
        corpus, tmp_path, "ignored", "trainer.max_steps=18", f"trainer.resume={half_dir}", *common
    )
    assert again["state"]["step"] == 18  # a finished run resumed at its limit takes no step
    a, b = weights(tmp_path / "outputs" / "runs" / "full"), weights(half_dir)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # metrics.jsonl: one history; each resumed session starts where its checkpoint was
    events = read_events(half_dir)
    starts = of_kind(events, "start")
    assert [(e["step"], e.get("resumed_from")) for e in starts] == [
        (0, None),
        (9, "checkpoints/last.pt"),
        (18, "checkpoints/last.pt"),
    ]
    full_events = read_events(tmp_path / "outputs" / "runs" / "full")
    full_scores = {e["step"]: e["bleu"] for e in of_kind(full_events, "validation")}
    scores = {e["step"]: e["bleu"] for e in of_kind(events, "validation")}
    assert scores.keys() == {6, 9, 12, 18} and full_scores.keys() == {6, 12, 18}
    assert all(scores[k] == full_scores[k] for k in (6, 12, 18))
    summary = json.loads((half_dir / "summary.json").read_text())
    assert summary == summarize(events)
    assert (summary["step"], summary["epoch"]) == (18, again["state"]["epoch"])
    assert summary["train_time"] == again["state"]["train_time"]
    assert (summary["best_bleu"], summary["best_step"]) == (
        again["state"]["best_bleu"],
        again["state"]["best_step"],
    )


def test_resuming_a_checkpoint_kept_outside_a_run_continues_in_the_new_run(corpus, tmp_path):
    first = run(corpus, tmp_path, "first", "trainer.max_steps=2", "trainer.average_last=0")
    kept = tmp_path / "kept" / "model.pt"
    kept.parent.mkdir()
    shutil.copy(Path(first["run_dir"]) / "checkpoints" / "last.pt", kept)
    new_dir = tmp_path / "outputs" / "runs" / "second"
    second = run(
        corpus, tmp_path, "second", "trainer.max_steps=3", f"trainer.resume={kept}",
        "trainer.average_last=0",
    )  # fmt: skip
    assert second["run_dir"] == str(new_dir) and second["state"]["step"] == 3
    assert load_checkpoint(new_dir / "checkpoints" / "last.pt")["state"]["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "kept", "outputs"]
    start = of_kind(read_events(new_dir), "start")[0]
    assert (start["step"], start["resumed_from"]) == (2, str(kept.resolve()))


def test_metrics_jsonl_holds_the_runs_events_with_the_logged_numbers(corpus, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    extra = ("trainer.max_steps=7", "trainer.val_every=3", "trainer.log_every=2")
    more = ("trainer.keep_last=2", "trainer.average_last=2")
    result = run(corpus, tmp_path, "m", *extra, *more)
    run_dir = Path(result["run_dir"])
    events = read_events(run_dir)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-2:] == ["averaged", "end"]
    start = events[0]
    log_text = (run_dir / "train.log").read_text()
    assert (start["step"], start["precision"], start["device_type"]) == (0, "32", "cpu")
    assert f"Transformer: {start['parameters']:,} parameters" in log_text
    assert start["parameters"] > 0 and "resumed_from" not in start
    # train events: every log window, with the numbers of the log line and of TensorBoard
    trains = of_kind(events, "train")
    assert [e["step"] for e in trains] == [2, 4, 6]
    assert all(e["updates"] == 2 and e["tokens"] > 0 for e in trains)
    for e in trains:
        assert f"step {e['step']}: loss {e['loss']:.3f}, lr {e['lr']:.2e}" in log_text
    board = EventAccumulator(str(run_dir / "tb"))
    board.Reload()
    tb_loss = [(v.step, v.value) for v in board.Scalars("train/loss")]
    assert tb_loss == [(e["step"], pytest.approx(e["loss"], rel=1e-6)) for e in trains]
    # validations at 3, 6 and at the end (7), each followed by its checkpoint
    history = result["state"]["history"]
    validations = of_kind(events, "validation")
    assert [(e["step"], e["bleu"], e["loss"]) for e in validations] == [
        (h["step"], h["bleu"], h["loss"]) for h in history
    ]
    assert [e["best"] for e in validations][0] is True
    checkpoints = of_kind(events, "checkpoint")
    assert [e["path"] for e in checkpoints] == [f"checkpoints/step_{n:08d}.pt" for n in (3, 6, 7)]
    assert [e["best"] for e in checkpoints] == [e["best"] for e in validations]
    averaged = of_kind(events, "averaged")[0]
    assert averaged["checkpoints"] == ["step_00000006", "step_00000007"]
    assert averaged["path"] == "checkpoints/averaged.pt"
    assert averaged["bleu"] == result["averaged"]["bleu"]
    end = events[-1]
    assert end["stop_reason"] == result["stop_reason"] == "reached trainer.max_steps=7"
    assert (end["step"], end["epoch"]) == (7, result["state"]["epoch"])
    # summary.json is derived from the events and keeps the keys its readers use
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary == summarize(events)
    state = result["state"]
    assert (summary["best_bleu"], summary["best_step"]) == (state["best_bleu"], state["best_step"])
    assert (summary["step"], summary["train_time"]) == (7, state["train_time"])
    assert summary["averaged_bleu"] == result["averaged"]["bleu"]
    assert summary["overrides"] == []  # called without Hydra
    hardware = summary["hardware"]
    assert hardware.keys() == {"device", "device_type", "world_size", "threads", "precision",
                               "torch"}  # fmt: skip
    assert (hardware["precision"], hardware["world_size"]) == ("32", 1)


def test_accumulation_equals_one_big_batch(corpus, tmp_path):
    cfg = compose_config(
        "train", tiny_run_overrides(corpus, tmp_path, "model.dropout=0.0", "model.attn_dropout=0.0")
    )
    from nmt.data.batching import make_batch
    from nmt.data.datasets import prepare_data
    from nmt.runtime.distributed import DistInfo
    from nmt.store.loading import build_model

    data = prepare_data(cfg.data)
    idx = list(range(16))
    results = []
    for groups in ([idx], [idx[:5], idx[5:]]):
        torch.manual_seed(0)
        model = build_model(cfg, data.tokenizers)
        opt = optim.build_optimizer(model, cfg.optim)
        micro = [make_batch(data.train, g) for g in groups]
        cfg.trainer.accumulate = len(groups)
        res = train_step(model, micro, opt, None, cfg, torch.device("cpu"), DistInfo())
        results.append((res, [p.grad.clone() for p in model.parameters()]))
    (one, p_one), (acc, p_acc) = results
    assert one.tokens == acc.tokens
    torch.testing.assert_close(one.loss, acc.loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(one.grad_norm, acc.grad_norm, rtol=1e-4, atol=1e-6)
    # The gradients agree up to float rounding. Compared as whole vectors: a ReLU input that
    # rounds to either side of 0 in the two batch layouts flips single elements.
    g_one = torch.cat([g.flatten() for g in p_one])
    g_acc = torch.cat([g.flatten() for g in p_acc])
    assert (g_one - g_acc).norm() / g_one.norm() < 5e-3


def test_non_finite_updates_are_skipped_then_stop_the_run(corpus, tmp_path, caplog, monkeypatch):
    calls = {"n": 0}

    def sometimes_nan(model, batch, ls):
        calls["n"] += 1
        loss = loss_sum(model, batch, ls)
        return loss * float("nan") if calls["n"] == 3 or calls["n"] >= 10 else loss

    monkeypatch.setattr("nmt.train.loop.loss_sum", sometimes_nan)
    with pytest.raises(FloatingPointError, match="in a row"):
        run(corpus, tmp_path, "nan", "trainer.max_steps=40", "trainer.val_every=100")
    assert calls["n"] == 14  # updates 3 and 10..14 skipped: the fifth in a row stops the run
    assert "update skipped" in caplog.text
    assert "non-finite" in caplog.text


def _nan_on_third_update(on_nan):
    """A loss whose third update is NaN (the update is skipped); ``on_nan`` runs then."""
    calls = {"n": 0}

    def nan_on_third(model, batch, ls):
        calls["n"] += 1
        loss = loss_sum(model, batch, ls)
        if calls["n"] != 3:
            return loss
        on_nan()
        return loss * float("nan")

    return nan_on_third


def test_a_skipped_update_counts_toward_the_time_limit(corpus, tmp_path, monkeypatch):
    clock = {"now": 0.0}  # the trainer's clock stands still but for the skipped update
    loss = _nan_on_third_update(lambda: clock.update(now=clock["now"] + 1000.0))
    monkeypatch.setattr("nmt.train.loop.loss_sum", loss)
    monkeypatch.setattr("nmt.train.loop.perf_counter", lambda: clock["now"])
    res = run(
        corpus, tmp_path, "t", "trainer.max_steps=20", "trainer.max_time=500",
        "trainer.val_every=100",
    )  # fmt: skip
    assert res["state"]["train_time"] == pytest.approx(1000.0)
    assert res["stop_reason"].startswith("reached the time limit")
    assert res["state"]["step"] == 2  # stopped right after the skipped third update


def test_a_signal_during_a_skipped_update_stops_there(corpus, tmp_path, monkeypatch):
    loss = _nan_on_third_update(lambda: signal.raise_signal(signal.SIGTERM))
    monkeypatch.setattr("nmt.train.loop.loss_sum", loss)
    res = run(corpus, tmp_path, "s", "trainer.max_steps=20", "trainer.val_every=100")
    assert res["stop_reason"] == "stopped by SIGTERM"
    assert res["state"]["step"] == 2  # no further update after the signal


def test_early_stopping_with_patience(corpus, tmp_path, monkeypatch):
    def flat(*args):
        return {"loss": 1.0, "ppl": 2.7, "bleu": 5.0, "chrf": 9.0, "seconds": 0.0}

    monkeypatch.setattr("nmt.train.loop.validation_scores", flat)
    res = run(
        corpus, tmp_path, "es", "trainer.max_steps=100", "trainer.val_every=2",
        "trainer.patience=3",
    )  # fmt: skip
    assert res["stop_reason"].startswith("early stopping")
    assert res["state"]["step"] == 8  # best at 2, then 3 validations without a gain
    assert res["state"]["best_step"] == 2


def test_max_epochs_limit(corpus, tmp_path):
    res = run(corpus, tmp_path, "ep", "trainer.max_epochs=2", "trainer.val_every=1000")
    assert res["state"]["epoch"] == 2
    assert "max_epochs" in res["stop_reason"]


def test_sigterm_finishes_the_step_saves_and_exits_for_a_restart(corpus, tmp_path):
    overrides = tiny_run_overrides(
        corpus,
        tmp_path,
        "trainer.max_steps=100000",
        "trainer.val_every=100000",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt.train", *overrides],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 120
    log_file = tmp_path / "run" / "train.log"
    while time.time() < deadline:
        if log_file.is_file() and "padding share" in log_file.read_text():
            break
        time.sleep(0.5)
    time.sleep(3)  # let some steps run
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out  # what a restarting launcher expects
    assert "stopped by SIGTERM" in out
    assert "trainer.resume=" in out
    ckpts = tmp_path / "run" / "checkpoints"
    payload = load_checkpoint(ckpts / "last.pt")
    step = payload["state"]["step"]
    assert step > 0
    # no validation at that step: the file is one to resume from, outside keep_last/averaging
    assert sorted(p.name for p in ckpts.glob("*_*.pt")) == [f"resume_{step:08d}.pt"]
    assert (ckpts / "last.pt").samefile(ckpts / f"resume_{step:08d}.pt")


def test_resume_files_are_dropped_once_a_newer_checkpoint_is_complete(tmp_path):
    ckpts = Checkpointer(tmp_path, keep_last=2)
    for step, validated in [(2, True), (3, False), (4, True), (5, False), (6, False)]:
        ckpts.save({"state": {"step": step}}, is_best=step == 2, validated=validated)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "best.pt", "last.pt", "resume_00000006.pt", "step_00000002.pt", "step_00000004.pt",
    ]  # fmt: skip
    for step in (8, 10):
        ckpts.save({"state": {"step": step}}, is_best=False)
    # keep_last counts validations only; the resume file went with the first newer checkpoint
    assert sorted(p.name for p in tmp_path.glob("*_*.pt")) == [
        "step_00000008.pt", "step_00000010.pt",
    ]  # fmt: skip
    assert load_checkpoint(tmp_path / "last.pt")["state"]["step"] == 10
    assert load_checkpoint(tmp_path / "best.pt")["state"]["step"] == 2  # a link outlives pruning


@pytest.mark.parametrize("name", ["inverse_sqrt", "noam", "constant"])
def test_warmup_schedules_peak_at_lr(name):
    cfg = compose_config("train", [f"optim.schedule={name}", "optim.warmup_steps=100"]).optim
    f = optim.schedule_fn(cfg, 0)
    values = [f(s) for s in range(400)]
    assert values[0] < 0.02
    assert max(values) == pytest.approx(1.0)
    assert values.index(max(values)) == 99
    assert all(b >= a for a, b in zip(values[:99], values[1:100], strict=True))  # warmup rises
    if name != "constant":
        assert values[399] == pytest.approx(0.5, rel=0.01)  # 1/sqrt decay: 4x steps, half lr


@pytest.mark.parametrize("name", ["cosine", "linear"])
def test_decay_schedules_reach_the_floor(name):
    cfg = compose_config(
        "train",
        [
            f"optim.schedule={name}",
            "optim.warmup_steps=10",
            "optim.min_lr=1e-4",
            "optim.lr=1e-3",
            "trainer.max_steps=110",
        ],
    ).optim
    f = optim.schedule_fn(cfg, 110)
    assert f(9) == pytest.approx(1.0)
    assert f(60) < 1.0
    assert f(110) == pytest.approx(0.1)


@pytest.mark.parametrize("name", ["cosine", "linear"])
def test_time_decay_follows_the_given_clock_not_the_step_count(name):
    cfg = compose_config(
        "train",
        [
            f"optim.schedule={name}",
            "optim.warmup_steps=10",
            "optim.decay_over=time",
            "trainer.max_time=100",
        ],
    ).optim
    clock = {"share": 0.0}
    f = optim.schedule_fn(cfg, 0, progress=lambda step: clock["share"])
    assert f(5) == pytest.approx(0.6)  # warmup still counts updates
    assert f(10) == pytest.approx(1.0)
    clock["share"] = 0.5
    half = f(11)
    assert f(10_000) == pytest.approx(half)  # the step count alone does not move it
    assert 0 < half < 1
    clock["share"] = 1.0
    assert f(12) == pytest.approx(0.0)
    clock["share"] = 1.7  # past the budget (a resumed run): stays at the floor
    assert f(13) == pytest.approx(0.0)


def test_time_decay_without_warmup_starts_at_the_peak(corpus, tmp_path):
    overrides = tiny_run_overrides(
        corpus, tmp_path, "optim=adam_linear", "optim.decay_over=time", "optim.warmup_steps=0",
        "trainer.max_time=1", "trainer.val_every=100000",
    )  # fmt: skip
    result = train(compose_config("train", overrides), tmp_path / "run")
    assert result["state"]["step"] > 0 and result["state"]["decay_start"] == 0.0


def test_time_decay_needs_a_time_limit():
    with pytest.raises(ConfigError, match="trainer.max_time"):
        check_train_config(
            compose_config(
                "train",
                ["optim=adam_linear", "optim.decay_over=time", "trainer.cpu_max_time=0"],
            )
        )
    with pytest.raises(ConfigCompositionException, match="optim.decay_over"):  # an Enum field
        compose_config("train", ["optim.decay_over=epochs"])


def test_time_decay_reaches_the_floor_at_the_time_limit(corpus, tmp_path):
    """A run of 3 s with decay over time ends with an lr near min_lr, whatever its speed."""
    overrides = tiny_run_overrides(
        corpus, tmp_path, "optim=adam_linear", "optim.decay_over=time",
        "optim.warmup_steps=2", "trainer.max_time=3", "trainer.val_every=100000",
        "trainer.log_every=1",
    )  # fmt: skip
    result = train(compose_config("train", overrides), tmp_path / "run")
    state = result["state"]
    assert result["stop_reason"].startswith("reached the time limit")
    payload = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    final_lr = payload["optimizer"]["param_groups"][0]["lr"]
    peak = payload["config"]["optim"]["lr"]
    assert state["step"] > 2 and 0 < state["decay_start"] < 3
    # the update that crossed the limit was scheduled with the whole budget spent
    assert final_lr == 0.0 < peak


def test_average_last_writes_a_validated_average_that_eval_picks_by_default(corpus, tmp_path):
    overrides = tiny_run_overrides(
        corpus, tmp_path, "trainer.max_steps=12", "trainer.val_every=3", "trainer.keep_last=3",
        "trainer.average_last=3", "decode.checkpoint=averaged", "decode.beam=2",
    )  # fmt: skip
    run = tmp_path / "run"
    result = train(compose_config("train", overrides), run)
    averaged = load_checkpoint(run / "checkpoints" / "averaged.pt")
    assert averaged["averaged"]["count"] == 3
    assert [Path(p).name for p in averaged["averaged"]["checkpoints"]] == [
        f"step_{n:08d}.pt" for n in (6, 9, 12)
    ]
    assert averaged["averaged"]["validation"]["bleu"] == result["averaged"]["bleu"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["averaged_bleu"] == result["averaged"]["bleu"]
    assert checkpoint_path(run) == run / "checkpoints" / "averaged.pt"


def test_average_last_beyond_keep_last_is_a_config_error():
    with pytest.raises(ConfigError, match="trainer.average_last=6"):
        check_train_config(
            compose_config("train", ["trainer.average_last=6", "trainer.keep_last=5"])
        )
    with pytest.raises(ConfigError, match="decode.checkpoint=averaged"):
        check_train_config(compose_config("train", ["decode.checkpoint=averaged"]))


@pytest.mark.slow(seconds=6)
def test_multirun_sweep_gives_one_run_per_combination_and_a_summary(corpus, tmp_path):
    sweep = tmp_path / "sweep"
    overrides = tiny_run_overrides(
        corpus, tmp_path, "trainer.max_steps=4", "trainer.val_every=4",
        f"hydra.sweep.dir={sweep}",
    )  # fmt: skip
    cmd = [sys.executable, "-m", "nmt.train", "-m", *overrides, "optim.lr=1e-3,2e-3",
           "model.d_ff=64,128"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [p for p in sweep.iterdir() if (p / "checkpoints" / "last.pt").is_file()]
    assert len(runs) == 4
    summary = __import__("json").loads((sweep / "summary.json").read_text())
    assert len(summary) == 4
    assert "Sweep summary" in proc.stdout


def test_validation_decodes_in_decodings_own_precision(corpus, tmp_path, monkeypatch):
    # bf16 training on a CPU validates with an fp32 decode: the BLEU nmt-eval gives the
    # checkpoint, and no new bf16 kernel shape at every decoding step
    from nmt.decode.search import translate_dataset
    from nmt.runtime.precision import resolve_precision

    seen: list[str] = []

    def spy(model, data, tokenizer, opts, device, limit=0):
        seen.append(opts.precision)
        return translate_dataset(model, data, tokenizer, opts, device, limit)

    extra = ("trainer.max_steps=2", "trainer.val_every=2", "trainer.average_last=0")
    monkeypatch.setattr(
        "nmt.train.loop.validation_scores", partial(validation_scores, translate=spy)
    )
    run(corpus, tmp_path, "bf16", "trainer.precision=bf16", *extra)
    run(corpus, tmp_path, "fp32", "trainer.precision=32", *extra)
    assert len(seen) == 2
    assert resolve_precision(seen[0], torch.device("cpu")) == "32"
    assert seen[1] == "32"


@pytest.mark.parametrize(
    ("given", "expected"), [(None, "16"), ("256", "256")], ids=["default", "user's value wins"]
)
def test_importing_nmt_bounds_the_onednn_kernel_caches(given, expected):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
    }
    if given is not None:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = env["LRU_CACHE_CAPACITY"] = given
    code = (
        "import os, nmt; "
        "print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], os.environ['LRU_CACHE_CAPACITY'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [expected, expected]


def drawn_steps(run_dir: Path) -> list[int]:
    """The steps at which TensorBoard holds the first sentence's cross-attention image."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"images": 0}).Reload()
    return sorted({image.step for image in events.Images("attention/cross/sent0")})


def test_attention_every_draws_at_the_first_validation_past_each_multiple(corpus, tmp_path):
    """Validations every 3 updates, views every 8: drawn at 3, then at 9 (past 8) and 18 (past
    16); a run stopped at 12 and resumed draws at the same steps as one that never stopped."""
    common = (
        "trainer.val_every=3",
        "trainer.attention_every=8",
        "trainer.attention_sentences=1",
        "trainer.attention_layers=none",
        "trainer.patience=0",
    )
    run(corpus, tmp_path, "full", "trainer.max_steps=18", *common)
    full_dir = tmp_path / "outputs" / "runs" / "full"
    validated = [e["step"] for e in of_kind(read_events(full_dir), "validation")]
    assert validated == [3, 6, 9, 12, 15, 18]
    assert drawn_steps(full_dir) == [3, 9, 18]
    run(corpus, tmp_path, "half", "trainer.max_steps=12", *common)
    half_dir = tmp_path / "outputs" / "runs" / "half"
    run(corpus, tmp_path, "x", "trainer.max_steps=18", f"trainer.resume={half_dir}", *common)
    assert drawn_steps(half_dir) == [3, 9, 18]


def test_a_negative_attention_every_is_refused_by_name():
    cfg = compose_config("train", ["trainer.attention_every=-1"])
    with pytest.raises(ConfigError, match="trainer.attention_every=-1"):
        check_train_config(cfg)

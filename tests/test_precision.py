"""``precision=auto``: one resolver, measured on CPUs with native bf16, cached, kept on resume."""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from nmt.config import GRUBahdanauConfig, TransformerConfig
from nmt.data.batching import TokenDataset
from nmt.decode import search
from nmt.decode.options import DecodeOptions
from nmt.models.registry import create_model
from nmt.runtime import precision as prec
from nmt.runtime.distributed import DistInfo
from nmt.runtime.precision import (
    Measurement,
    SpeedProbe,
    measure_speed,
    probe_model,
    resolve_precision,
)
from nmt.store.checkpoint import load_checkpoint
from nmt.train.command import train
from nmt.train.setup import training_precision
from nmt.train.step import LossTerms, loss_sum

from .helpers import compose_config, tiny_run_overrides

CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("one_thread")


class StubProbe:
    """A probe whose measurement is given, counting how often it is asked for."""

    def __init__(self, fp32: float, bf16: float, agree: bool = True) -> None:
        self.fp32, self.bf16, self.agree = fp32, bf16, agree
        self.calls = 0

    def measure(self) -> Measurement:
        self.calls += 1
        return Measurement(self.fp32, self.bf16, seconds=0.5, rows=8, pairs=3, agree=self.agree)

    def probe(self, cache_dir: Path | None = None, **shape: object) -> SpeedProbe:
        return SpeedProbe(self.measure, {"model": "tiny", **shape}, cache_dir)


@pytest.fixture
def bf16_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This CPU reports native bf16 (whatever the machine running the tests has)."""
    monkeypatch.setattr(prec, "native_bf16", lambda device: True)


# ------------------------------------------------------------------------------ the decision


@pytest.mark.parametrize(("fp32", "bf16", "expected"), [(100.0, 180.0, "bf16"), (300, 200, "32")])
def test_auto_picks_the_faster_precision(bf16_cpu, fp32, bf16, expected) -> None:
    stub = StubProbe(fp32, bf16)
    assert resolve_precision("auto", CPU, stub.probe()) == expected
    assert stub.calls == 1


@pytest.mark.parametrize(("fp32_cost", "bf16_cost", "expected"), [(2.0, 1.0, "bf16"), (1, 3, "32")])
def test_measurement_times_both_precisions_on_whole_batches_and_takes_the_faster(
    fp32_cost: float, bf16_cost: float, expected: str
) -> None:
    """With a stub clock, a step costs ``cost`` ms per sentence; the medians decide."""
    now = [0.0]
    cost = {"32": fp32_cost * 1e-3, "bf16": bf16_cost * 1e-3}
    steps: list[tuple[str, int]] = []

    def step(precision: str, rows: int) -> int:
        now[0] += rows * cost[precision]
        steps.append((precision, rows))
        return rows * 10  # ten target tokens per sentence

    m = measure_speed(step, max_rows=64, clock=lambda: now[0], budget=1.0)
    assert m.choice == expected
    assert m.rows == 64  # a whole training batch
    assert all(rows == 64 for _, rows in steps[1:])  # after the one-sentence first use
    assert m.fp32 == pytest.approx(10 / cost["32"]) and m.bf16 == pytest.approx(10 / cost["bf16"])
    timed = steps[-2 * m.pairs :]
    assert [p for p, _ in timed].count("bf16") == m.pairs == [p for p, _ in timed].count("32")
    assert timed[0][0] != timed[2][0]  # the order alternates between pairs


def test_a_machine_too_busy_to_measure_stops_the_probe_early() -> None:
    """The untimed steps take 0.1 s, then the machine slows down: each step takes seconds (stub
    clock), one pair passes the limit and the measurement is not trusted."""
    now, n = [0.0], [0]

    def step(precision: str, rows: int) -> int:
        n[0] += 1
        now[0] += 0.1 if n[0] <= 3 else 4.0 if precision == "32" else 2.0
        return rows

    m = measure_speed(step, max_rows=64, clock=lambda: now[0])
    assert m.pairs == 1 and m.choice == "bf16" and not m.trusted


def test_a_large_models_slow_steps_still_get_the_pairs_it_needs() -> None:
    """Whole batches of 3 s (fp32) and 2 s (bf16) from the start: the limit grows with the
    untimed step, so MIN_PAIRS pairs are timed and the answer is trusted."""
    now = [0.0]

    def step(precision: str, rows: int) -> int:
        now[0] += (3.0 if precision == "32" else 2.0) * rows / 64
        return rows

    m = measure_speed(step, max_rows=64, clock=lambda: now[0])
    assert m.pairs == prec.MIN_PAIRS and m.choice == "bf16" and m.trusted


def test_pairs_that_disagree_are_not_trusted() -> None:
    now, n = [0.0], [0]

    def step(precision: str, rows: int) -> int:  # bf16 faster in the first timed pair only
        n[0] += 1
        now[0] += 0.01 if (precision == "bf16") == (n[0] <= 5) else 0.02
        return rows

    m = measure_speed(step, max_rows=64, clock=lambda: now[0])
    assert m.pairs == prec.MAX_PAIRS and not m.agree and not m.trusted


@pytest.mark.parametrize("forced", ["32", "bf16", "16"])
def test_a_forced_precision_never_probes(bf16_cpu, forced: str) -> None:
    stub = StubProbe(1.0, 2.0)
    assert resolve_precision(forced, CPU, stub.probe()) == forced
    assert stub.calls == 0


def test_a_cpu_without_native_bf16_never_probes(monkeypatch) -> None:
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: False, raising=False)
    stub = StubProbe(1.0, 1000.0)
    assert resolve_precision("auto", CPU, stub.probe()) == "32"
    assert stub.calls == 0


def test_decoding_is_decided_without_a_probe(bf16_cpu) -> None:
    # a GPU's choice, by compute capability and never probed: tests/test_cuda_paths.py
    assert resolve_precision("auto", CPU) == "32"  # decoding passes no probe


def test_decoding_with_auto_on_a_bf16_cpu_runs_in_fp32(bf16_cpu, monkeypatch) -> None:
    used: list[str] = []
    real_autocast = search.autocast

    def recording(precision: str, device: torch.device):
        used.append(precision)
        return real_autocast(precision, device)

    monkeypatch.setattr(search, "autocast", recording)
    model = tiny_model("transformer")
    data = TokenDataset([[5, 6, 7], [8, 9]], [[5], [6]])
    opts = DecodeOptions(max_output_len_a=0.0, max_output_len_b=3, precision="auto")
    hyps = search.decode_dataset(model, data, opts, CPU)
    assert len(hyps) == 2 and used and set(used) == {"32"}


def test_an_unknown_precision_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="'fp8'"):
        resolve_precision("fp8", CPU)


# ------------------------------------------------------------------------------ the cache


def test_the_choice_is_cached_and_reused_without_probing(bf16_cpu, tmp_path, caplog) -> None:
    cache = tmp_path / "cache" / "precision"
    first = StubProbe(100.0, 150.0)
    assert resolve_precision("auto", CPU, first.probe(cache)) == "bf16"
    [file] = cache.glob("*.json")
    entry = json.loads(file.read_text())
    assert entry["precision"] == "bf16" and entry["measurement"]["bf16"] == 150.0
    assert entry["key"]["machine"]["torch"] == torch.__version__
    assert entry["key"]["machine"]["threads"] == torch.get_num_threads()
    # a later run with the same model and machine reads the file: no probe, the same answer
    # even though a probe would now say otherwise
    later = StubProbe(500.0, 150.0)
    with caplog.at_level(logging.INFO, logger="nmt.runtime.precision"):
        assert resolve_precision("auto", CPU, later.probe(cache)) == "bf16"
    assert later.calls == 0
    assert "cached" in caplog.text and "fp32 100 vs bf16 150" in caplog.text


def test_another_model_shape_or_thread_count_probes_again(bf16_cpu, tmp_path) -> None:
    cache = tmp_path / "cache"
    assert resolve_precision("auto", CPU, StubProbe(100.0, 150.0).probe(cache)) == "bf16"
    other = StubProbe(300.0, 150.0)
    assert resolve_precision("auto", CPU, other.probe(cache, max_tokens=999)) == "32"
    assert other.calls == 1
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        more = StubProbe(300.0, 150.0)
        assert resolve_precision("auto", CPU, more.probe(cache)) == "32"
    finally:
        torch.set_num_threads(threads)
    assert more.calls == 1
    assert len(list(cache.glob("*.json"))) == 3


def test_an_untrusted_measurement_is_used_but_not_cached(bf16_cpu, tmp_path, caplog) -> None:
    cache = tmp_path / "cache"
    noisy = StubProbe(100.0, 150.0, agree=False)
    with caplog.at_level(logging.WARNING, logger="nmt.runtime.precision"):
        assert resolve_precision("auto", CPU, noisy.probe(cache)) == "bf16"
    assert "not cached" in caplog.text
    assert not cache.exists() or not list(cache.iterdir())
    assert resolve_precision("auto", CPU, noisy.probe(cache)) == "bf16"
    assert noisy.calls == 2


@pytest.mark.parametrize(
    "damage",
    [
        lambda e: "{ not json",
        lambda e: "",
        lambda e: json.dumps({**e, "precision": "32"}),  # choice contradicts the figures
        lambda e: json.dumps({**e, "key": {**e["key"], "shape": {"model": "other"}}}),
        lambda e: json.dumps({**e, "measurement": {"fp32": "fast"}}),
        lambda e: json.dumps({**e, "measurement": {**e["measurement"], "agree": False}}),
        lambda e: json.dumps([1, 2]),
    ],
)
def test_a_damaged_cache_file_is_ignored_and_rewritten(bf16_cpu, tmp_path, damage, caplog) -> None:
    cache = tmp_path / "cache"
    resolve_precision("auto", CPU, StubProbe(100.0, 150.0).probe(cache))
    [file] = cache.glob("*.json")
    file.write_text(damage(json.loads(file.read_text())))
    again = StubProbe(300.0, 150.0)
    with caplog.at_level(logging.WARNING, logger="nmt.runtime.precision"):
        assert resolve_precision("auto", CPU, again.probe(cache)) == "32"
    assert again.calls == 1
    assert "ignoring the precision cache" in caplog.text and str(file) in caplog.text
    assert json.loads(file.read_text())["precision"] == "32"
    assert list(cache.iterdir()) == [file]  # written through a temporary file, none left


# ------------------------------------------------------------------------------ the probe


def tiny_model(kind: str) -> torch.nn.Module:
    if kind == "gru":
        cfg = GRUBahdanauConfig(emb_dim=8, hidden_dim=12, attn_dim=10, dropout=0.3)
    else:
        cfg = TransformerConfig(d_model=16, heads=2, d_ff=32, enc_layers=1, dec_layers=1)
    return create_model(
        OmegaConf.structured(cfg), src_vocab_size=30, tgt_vocab_size=30, pad_id=0,
        shared_vocab=True,
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["gru", "transformer"])
def test_the_probe_leaves_weights_gradients_mode_and_rng_as_they_were(kind: str) -> None:
    model = tiny_model(kind).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    m = probe_model(
        model, lambda mod, b: loss_sum(mod, b, LossTerms(0.1)), 200, lengths=(7, 9), vocab=(30, 30)
    )
    assert m.fp32 > 0 and m.bf16 > 0 and m.pairs >= prec.MIN_PAIRS
    assert 1 <= m.rows <= 200 // 10  # never more than a training batch of the probe's width
    assert not model.training
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


# ------------------------------------------------------------------------------ training


def test_training_records_the_measured_choice_and_a_resumed_run_keeps_it(
    bf16_cpu, corpus, tmp_path, monkeypatch
) -> None:
    stub = StubProbe(300.0, 100.0)  # fp32 faster: the opposite of what native bf16 suggests
    monkeypatch.setattr("nmt.train.setup.probe_model", lambda *a, **k: stub.measure())
    extra = (
        "trainer.precision=auto",
        "trainer.val_every=1000",
        "trainer.device=cpu",
        "trainer.threads=1",
    )
    cfg = compose_config(
        "train", tiny_run_overrides(corpus, tmp_path, "trainer.max_steps=2", *extra)
    )
    assert str(cfg.trainer.precision) == "auto"
    run_dir = tmp_path / "run"
    train(cfg, run_dir)
    assert stub.calls == 1
    assert str(cfg.trainer.precision) == "auto"  # the caller's config is left as it was
    saved = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert saved["config"]["trainer"]["precision"] == "32"
    assert OmegaConf.load(run_dir / "config.yaml").trainer.precision == "32"
    assert json.loads((run_dir / "summary.json").read_text())["hardware"]["precision"] == "32"
    assert list((tmp_path / "data" / "cache" / "precision").glob("*.json"))

    # resumed without the cache and with a probe that would now choose bf16: keeps fp32
    for file in (tmp_path / "data" / "cache" / "precision").glob("*.json"):
        file.unlink()
    stub.fp32, stub.bf16, stub.calls = 100.0, 300.0, 0
    resumed = compose_config(
        "train",
        tiny_run_overrides(
            corpus, tmp_path, "trainer.max_steps=3", f"trainer.resume={run_dir}", *extra
        ),
    )
    train(resumed, tmp_path / "unused")
    assert stub.calls == 0
    saved = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert saved["state"]["step"] == 3 and saved["config"]["trainer"]["precision"] == "32"


def _rank(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks resolving ``auto``; each rank's probe would answer differently."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        prec.native_bf16 = lambda device: True
        stub = StubProbe(100.0, 200.0) if rank == 0 else StubProbe(200.0, 100.0)
        cfg = OmegaConf.create({"trainer": {"precision": "auto"}})
        info = DistInfo(rank=rank, world_size=2)
        choice = training_precision(cfg, CPU, info, None, stub.probe)
        Path(out, f"rank{rank}.json").write_text(json.dumps([choice, stub.calls]))
    finally:
        torch.distributed.destroy_process_group()


def test_under_ddp_on_cpu_rank_0_probes_and_every_rank_takes_its_choice(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert results == [["bf16", 1], ["bf16", 0]]

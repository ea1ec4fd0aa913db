"""The training loop's waits for the device, checked on a CPU: at most one host read of a
tensor's value per update (single process and DDP), fp16 updates skipped for overflowing
gradients or a non-finite loss, and batches copied to a GPU from page-locked memory."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from nmt.data.batching import Batch, make_batch
from nmt.data.datasets import prepare_data
from nmt.store.checkpoint import load_checkpoint
from nmt.train import loop
from nmt.train.command import train
from nmt.train.runlog import of_kind, read_events
from nmt.train.step import loss_sum

from .helpers import TINY_TRANSFORMER, compose_config, tiny_run_overrides

# what reads a tensor's value on the host: on a GPU, each waits for the device to get there
READS = ("item", "tolist", "cpu", "numpy", "__array__", "__bool__", "__float__", "__int__",
         "__index__")  # fmt: skip
TINY_GRU = ["model=gru_bahdanau", "model.emb_dim=32", "model.hidden_dim=32", "model.attn_dim=32"]
# six updates, two log windows ending in the counted updates, validation only at the end
COUNTED = ("trainer.threads=1", "trainer.max_steps=6", "trainer.log_every=2",
           "trainer.val_every=1000")  # fmt: skip


def overrides(corpus: Path, work: Path, model: str, *extra: str) -> list[str]:
    """A seconds-long run of the tiny Transformer or GRU."""
    base = tiny_run_overrides(corpus, work, *extra)
    if model == "transformer":
        return base
    return [o for o in base if o not in TINY_TRANSFORMER] + TINY_GRU


class DeviceReads:
    """Counts the host reads of tensor values (:data:`READS`) in each update of the training
    loop: from one update's start to the next's, its stop check included. Not counted: the
    batch built on the host (``make_batch``), validations and checkpoints, and the tensors that
    torch keeps in host memory on any device (a PackedSequence's batch sizes)."""

    def __init__(self, patch: pytest.MonkeyPatch) -> None:
        self.updates: list[int] = []  # reads per update
        self.sites: list[str] = []  # where each counted read was made
        self.on = False
        self.host: set[int] = set()  # storages in host memory by design
        for name in READS:
            patch.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name)))
        patch.setattr(loop.Trainer, "_epoch", self._within(loop.Trainer._epoch, True))
        for name in ("validate", "save"):
            patch.setattr(loop.Trainer, name, self._within(getattr(loop.Trainer, name), False))
        patch.setattr(loop, "make_batch", self._within(make_batch, False))
        update = loop.Trainer._update
        patch.setattr(loop.Trainer, "_update", lambda *a: self.updates.append(0) or update(*a))
        pack = torch.nn.utils.rnn.pack_padded_sequence
        patch.setattr(
            "nmt.models.gru.pack_padded_sequence", lambda *a, **k: self._packed(pack(*a, **k))
        )

    def _packed(self, packed: Any) -> Any:
        self.host.add(packed.batch_sizes.untyped_storage().data_ptr())
        return packed

    def _counted(self, read: Callable[..., Any]) -> Callable[..., Any]:
        def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if self.on and self.updates and tensor.untyped_storage().data_ptr() not in self.host:
                self.updates[-1] += 1
                caller = sys._getframe(1)
                self.sites.append(f"{read.__name__} {caller.f_code.co_filename}:{caller.f_lineno}")
            return read(tensor, *args, **kwargs)

        return counted

    def _within(self, fn: Callable[..., Any], on: bool) -> Callable[..., Any]:
        def switched(*args: Any, **kwargs: Any) -> Any:
            before, self.on = self.on, on
            try:
                return fn(*args, **kwargs)
            finally:
                self.on = before

        return switched


@pytest.mark.parametrize("model", ["transformer", "gru"])
def test_an_update_waits_for_the_device_at_most_once(corpus, tmp_path, monkeypatch, model):
    reads = DeviceReads(monkeypatch)
    moved = []
    to_device = Batch.to_device
    monkeypatch.setattr(Batch, "to_device", lambda b, d: moved.append(d) or to_device(b, d))
    result = train(compose_config("train", overrides(corpus, tmp_path, model, *COUNTED)),
                   tmp_path / "run")  # fmt: skip
    assert result["state"]["step"] == 6
    assert len(reads.updates) == 6 and max(reads.updates) <= 1, (reads.updates, reads.sites)
    assert moved == [torch.device("cpu")] * 6  # the loop's batches go through to_device


# One rank of a two-process run (argv: rank, run folder, overrides): its reads per
# update, counted as in one process, are printed.
COUNTING_RANK = """
import json, sys
from pathlib import Path
import pytest
from nmt.runtime.distributed import exit_joined
from nmt.train.command import train
from tests.helpers import compose_config
from tests.test_step_sync import DeviceReads
with pytest.MonkeyPatch.context() as patch:
    reads = DeviceReads(patch)
    result = train(compose_config("train", sys.argv[3:]), Path(sys.argv[2]))
print("RESULT", json.dumps({"updates": reads.updates, "sites": reads.sites,
                            "step": result["state"]["step"]}), flush=True)
exit_joined(0)
"""


@pytest.mark.slow(seconds=10)
def test_a_ddp_update_waits_for_the_device_at_most_once(corpus, tmp_path):
    """The ranks' token count, their agreement on signals, on rank 0's checkpoint clock and on
    the training time (which the time-decayed schedule follows) ride on the update's one read."""
    from .test_distributed import two_ranks

    extra = ("optim=adamw_cosine", "optim.decay_over=time", "trainer.max_time=600",
             "trainer.save_every_minutes=0.00001")  # fmt: skip
    args = overrides(corpus, tmp_path, "transformer", *COUNTED, *extra)
    outs = two_ranks(COUNTING_RANK, [str(tmp_path / "ddp"), *args], 300)
    for out in outs:
        result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
        assert result["step"] == 6 and len(result["updates"]) == 6, result
        assert max(result["updates"]) <= 1, result
    events = read_events(tmp_path / "ddp")
    assert len(of_kind(events, "checkpoint")) >= 6  # rank 0's clock called for them all


class Overflow(torch.autograd.Function):
    """The identity, whose backward makes every gradient infinite (as an fp16 overflow)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad * float("inf")


def spoiled(on_call: int, spoil: Callable[[torch.Tensor], torch.Tensor]):
    """loss_sum, with ``spoil`` applied to the loss of the ``on_call``-th batch; the calls."""
    calls = {"n": 0}

    def loss(model, batch, label_smoothing):
        calls["n"] += 1
        value = loss_sum(model, batch, label_smoothing)
        return spoil(value) if calls["n"] == on_call else value

    return loss, calls


FP16 = ("trainer.precision=16", "trainer.max_steps=6", "trainer.log_every=3",
        "trainer.val_every=1000", "trainer.threads=1")  # fmt: skip


@pytest.mark.parametrize(
    ("spoil", "logged"),
    [(Overflow.apply, "fp16 gradients overflowed"), (lambda x: x * float("nan"), "non-finite")],
    ids=["overflow", "nan-loss"],
)
def test_a_skipped_fp16_update_is_no_update(corpus, tmp_path, monkeypatch, caplog, spoil, logged):
    """An update skipped for overflowing gradients (the scaler's) or a non-finite loss does not
    count as an update, does not step the schedule, and stays out of the logged loss."""
    loss, calls = spoiled(2, spoil)
    monkeypatch.setattr("nmt.train.loop.loss_sum", loss)
    result = train(compose_config("train", tiny_run_overrides(corpus, tmp_path, *FP16)),
                   tmp_path / "run")  # fmt: skip
    assert calls["n"] == 7 and result["state"]["step"] == 6  # one of 7 updates skipped
    saved = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    # the schedule stepped once per applied update, as the optimizer did
    assert saved["scheduler"]["last_epoch"] == 6
    assert {float(s["step"]) for s in saved["optimizer"]["state"].values()} == {6.0}
    assert saved["scaler"]["scale"] == 2.0**15  # the skipped update halved the loss scale
    trains = of_kind(read_events(tmp_path / "run"), "train")
    assert [(e["step"], e["updates"], e["skipped"]) for e in trains] == [(3, 3, 1), (6, 3, 0)]
    assert all(e["loss"] is not None and e["loss"] > 0 for e in trains)  # finite
    assert logged in caplog.text


def test_fp16_overflows_in_a_row_are_the_scalers_until_too_many(corpus, tmp_path, monkeypatch):
    """Seven overflowing updates in a row (more than MAX_BAD_STEPS) only lower the loss scale;
    MAX_OVERFLOWS of them stop the run."""
    calls = {"n": 0}

    def overflowing(model, batch, label_smoothing):
        calls["n"] += 1
        value = loss_sum(model, batch, label_smoothing)
        return Overflow.apply(value) if calls["n"] in range(2, 9) or calls["n"] > 20 else value

    monkeypatch.setattr("nmt.train.loop.loss_sum", overflowing)
    run = tiny_run_overrides(corpus, tmp_path, *FP16)
    result = train(compose_config("train", run), tmp_path / "seven")
    assert calls["n"] == 13 and result["state"]["step"] == 6
    monkeypatch.setattr("nmt.train.step.MAX_OVERFLOWS", 3)
    calls["n"] = 20
    with pytest.raises(FloatingPointError, match="3 updates in a row overflowed"):
        train(compose_config("train", run), tmp_path / "endless")
    assert calls["n"] == 23


def test_batches_reach_a_gpu_from_page_locked_memory(corpus, tmp_path, monkeypatch):
    data = prepare_data(compose_config("train", tiny_run_overrides(corpus, tmp_path)).data)
    batch = make_batch(data.train, [0, 1, 2])
    pinned, copies = [], []
    monkeypatch.setattr(Batch, "pin_memory", lambda b: pinned.append(b) or b)
    monkeypatch.setattr(Batch, "to", lambda b, device, non_blocking=False: copies.append(
        (str(device), non_blocking)) or b)  # fmt: skip
    assert batch.to_device(torch.device("cuda")) is batch
    assert pinned == [batch] and copies == [("cuda", True)]
    pinned.clear()
    copies.clear()
    batch.to_device(torch.device("cpu"))
    assert pinned == [] and copies == [("cpu", True)]

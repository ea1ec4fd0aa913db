"""nmt.store.checkpoint.content_digest: equal for the same course of training, whatever the clock;
different for any change of weights, optimizer state or random state."""

from __future__ import annotations

import subprocess
import sys

import torch

from nmt.store.checkpoint import content_digest, rng_state, save_checkpoint

from .helpers import REPO


def _payload(seed: int = 0, train_time: float = 12.5, seconds: float = 3.0) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": {"last_epoch": 1},
        "scaler": None,
        "rng": rng_state(),
        "state": {
            "step": 1,
            "train_time": train_time,
            "decay_start": -1.0,
            "history": [{"step": 1, "bleu": 3.0, "seconds": seconds}],
        },  # fmt: skip
        "tokenizers": {"joint": True, "src": b"model bytes"},
        "config": {"outputs": f"/tmp/run-{train_time}"},
    }


def test_clock_and_folders_do_not_count_but_every_weight_does() -> None:
    a = content_digest(_payload())
    assert content_digest(_payload(train_time=99.0, seconds=7.0)) == a
    changed = _payload()
    w = changed["model"]["weight"]
    w.view(-1)[0] = torch.nextafter(w.view(-1)[0], torch.tensor(1.0))  # one ulp
    assert content_digest(changed)["model"] != a["model"]
    changed = _payload()
    changed["state"]["history"][0]["bleu"] = 3.01
    assert content_digest(changed)["history"] != a["history"]
    other = content_digest(_payload(seed=1))
    assert other["model"] != a["model"] and other["optimizer"] != a["optimizer"]


def test_the_script_prints_one_line_per_checkpoint(tmp_path) -> None:
    for name in ("a.pt", "b.pt"):
        save_checkpoint(_payload(), tmp_path / name)
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "checkpoint_digest.py"),
         str(tmp_path / "a.pt"), str(tmp_path / "b.pt")],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert [line.split()[0] for line in out] == ["a.pt", "b.pt"]
    assert out[0].split(" ", 1)[1] == out[1].split(" ", 1)[1]
    bad = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "checkpoint_digest.py"), str(tmp_path / "c.pt")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 2 and "c.pt" in bad.stderr

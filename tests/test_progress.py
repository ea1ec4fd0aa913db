"""The training progress bar counts toward whichever limit ends the run first."""

from __future__ import annotations

import io

import pytest

from nmt.train.progress import Limits, Position, ProgressBar, clock, seconds_left, share_done


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_share_is_that_of_the_limit_nearest_to_being_reached() -> None:
    at = Position(step=100, train_time=600.0, epochs=2.5)
    assert share_done(Limits(max_steps=1000), at) == pytest.approx(0.1)
    assert share_done(Limits(time_limit=1800.0), at) == pytest.approx(1 / 3)
    assert share_done(Limits(max_epochs=10), at) == pytest.approx(0.25)
    both = Limits(max_steps=1000, time_limit=1800.0, max_epochs=10)
    assert share_done(both, at) == pytest.approx(1 / 3)
    assert share_done(Limits(), at) is None
    assert share_done(Limits(max_steps=50), at) == 1.0  # a resumed run past a lowered limit


def test_the_time_left_is_the_least_any_limit_leaves_at_the_rate_so_far() -> None:
    at = Position(step=100, train_time=600.0, epochs=2.0)  # 6 s a step, 300 s an epoch
    assert seconds_left(Limits(time_limit=1800.0), at) == pytest.approx(1200.0)
    assert seconds_left(Limits(max_steps=150), at) == pytest.approx(300.0)
    assert seconds_left(Limits(max_epochs=3), at) == pytest.approx(300.0)
    assert seconds_left(Limits(max_steps=1000, time_limit=1800.0), at) == pytest.approx(1200.0)
    assert seconds_left(Limits(max_steps=10), Position(0, 0.0, 0.0)) is None  # no rate yet
    assert seconds_left(Limits(), at) is None
    assert clock(3725) == "1:02:05" and clock(65.4) == "1:05"


def test_on_a_terminal_the_bar_shows_step_time_left_and_the_figures() -> None:
    out = Terminal()
    bar = ProgressBar(Limits(max_steps=10, time_limit=100.0), enabled=True, stream=out)
    bar.show(Position(5, 20.0, 0.5), loss="4.321", **{"tokens/s": "4,800"})
    bar.show(Position(6, 24.0, 0.6), BLEU="12.30")
    bar.close()
    last = out.getvalue().split("\r")[-1]
    assert "60%" in last and "step 6/10" in last and "0:24 < 0:16 left" in last
    assert "loss 4.321" in last and "tokens/s 4,800" in last and "BLEU 12.30" in last


def test_off_a_terminal_or_when_disabled_nothing_is_drawn() -> None:
    for stream, enabled in ((io.StringIO(), True), (Terminal(), False)):
        bar = ProgressBar(Limits(max_steps=10), enabled=enabled, stream=stream)
        bar.show(Position(5, 20.0, 0.5), loss="1.0")
        bar.close()
        assert stream.getvalue() == ""

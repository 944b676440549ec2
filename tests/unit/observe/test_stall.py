"""The stall forecast: one model for the loader's warning and ``zephon plan --bandwidth``."""

from __future__ import annotations

import pytest

from zephon_store.observe.options import ObserveOptions
from zephon_store.observe.stall import Stall, stall_message


def test_a_run_that_keeps_up_has_no_stall():
    assert Stall.first([1e6] * 100, rate=20e6, step_s=0.1, budget=64 << 20) is None


def test_the_first_step_past_the_lead_waits_what_is_missing():
    # 10 MB a step every 0.2 s needs 50 MB/s; 25 MB/s arrive; 40 MB already on the node.
    s = Stall.first([10e6] * 40, rate=25e6, step_s=0.2, budget=64e6, lead_bytes=40e6,
                    start_step=1000)
    assert s is not None and s.step > 1003
    assert s.wait_s == pytest.approx(0.2, abs=0.05)
    assert s.need_bps == pytest.approx(50e6, rel=0.01) and s.rate_bps == 25e6


def test_a_small_budget_stalls_a_burst_a_large_one_absorbs():
    need = [0.0] * 20 + [30e6] * 3 + [0.0] * 20     # a burst of big steps
    assert Stall.first(need, rate=40e6, step_s=0.5, budget=8e6) is not None
    assert Stall.first(need, rate=40e6, step_s=0.5, budget=256e6) is None


def test_the_message_is_one_line_with_the_numbers_and_the_option():
    msg = stall_message(Stall(1200, 0.4, 38e6, 55e6, 64 << 20))
    assert "\n" not in msg
    assert msg.startswith("zephon: step 1,200 will wait ~0.4 s for data: storage delivers "
                          "38 MB/s, the next steps need 55 MB/s")
    assert "raise prefetch_bytes (now 64 MiB)" in msg


def test_observe_options_check_and_place_the_step_log(monkeypatch):
    with pytest.raises(ValueError, match="stall_horizon must be >= 0"):
        ObserveOptions(stall_horizon=-1)
    assert ObserveOptions(step_log="s.jsonl").step_log_path(1) is None   # rank 0 only
    monkeypatch.setenv("ZEPHON_STEP_LOG", "run/steps-{rank}.jsonl")
    assert ObserveOptions().step_log_path(2) == "run/steps-2.jsonl"

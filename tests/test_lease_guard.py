"""A bench keeps clear of the lease's end: it starts only when it fits, and names the `fab extend` to run."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from provision import config
from provision.lease_guard import LeaseTooShort, check_bench_fits, hours_to_extend, model_estimate_s, next_model_fits

NOW = datetime(2026, 12, 6, 3, 0, tzinfo=timezone.utc)
PROFILES = config.settings()["bench"]


def test_a_model_takes_three_windows_per_concurrency_level_and_some_overhead():
    # The seed's full profile: six levels (2:12:2) x 3 windows of 5 s, plus 15 s.
    assert model_estimate_s(PROFILES["full"]) == 6 * 3 * 5 + 15
    assert model_estimate_s({"concurrency_range": "8", "measurement_interval_ms": 1000}) == 1 * 3 * 1 + 15


def test_a_bench_that_fits_before_the_margin_starts():
    five_models = 5 * model_estimate_s(PROFILES["full"])  # 525 s
    end = NOW + timedelta(seconds=five_models + 15 * 60)
    check_bench_fits(end, 5, PROFILES["full"], "full", 15, NOW)


def test_a_bench_that_would_outlive_the_lease_is_refused_with_the_command_that_makes_it_fit():
    end = NOW + timedelta(minutes=13)
    with pytest.raises(LeaseTooShort) as refused:
        check_bench_fits(end, 5, PROFILES["full"], "full", 15, NOW)
    message = str(refused.value)
    assert "the lease ends 2026-12-06T03:13+00:00, in 13 min" in message
    assert "5 model(s) x 6 concurrency level(s) x 3 windows, full profile" in message
    assert "a safety margin of 15 min" in message
    assert "Run `fab extend --hours 1` first, or bench less (--quick, --model M)" in message


def test_a_lease_that_has_ended_is_said_to_have_ended():
    with pytest.raises(LeaseTooShort, match="the lease ended;"):
        check_bench_fits(NOW - timedelta(minutes=1), 1, PROFILES["quick"], "quick", 15, NOW)


def test_the_hours_to_extend_cover_the_shortfall_in_whole_hours():
    assert hours_to_extend(1) == 1
    assert hours_to_extend(3600) == 1
    assert hours_to_extend(3601) == 2
    assert hours_to_extend(-10) == 1  # asked only when something is short: at least one hour


def test_the_next_model_is_measured_only_if_it_ends_before_the_margin():
    end = NOW + timedelta(minutes=20)
    assert next_model_fits(end, estimate_s=5 * 60, margin_minutes=15, now=NOW)
    assert not next_model_fits(end, estimate_s=5 * 60 + 1, margin_minutes=15, now=NOW)

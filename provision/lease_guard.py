"""Keep a bench clear of the lease's end: a bench that outlives its lease loses its results.

On a target whose hosts go away at a known time (a Chameleon lease), the bench
first checks that all its models fit before the end, with a safety margin, and
names the `fab extend` to run when they do not. It then checks again before
each model (the lease may have been extended, or shortened, meanwhile): when
the next model would end inside the margin, the bench stops there and keeps
what it measured.

How long a model takes is estimated from the profile: perf_analyzer measures
every concurrency level in at least three windows; after the first model, the
longest model measured so far is the estimate.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from provision.errors import OperationError
from provision.perf import concurrency_levels

# perf_analyzer needs three windows per level at least (its stability check compares the last three).
WINDOWS_PER_LEVEL = 3
# Loading the input, starting perf_analyzer, its warm-up request, fetching the CSV.
MODEL_OVERHEAD_S = 15.0


class LeaseTooShort(OperationError):
    """The bench would not end before the lease does (minus the margin); str() says what to run."""


def model_estimate_s(profile: dict) -> float:
    """Seconds one model takes at least with this profile."""
    levels = len(concurrency_levels(profile["concurrency_range"]))
    window_s = int(profile["measurement_interval_ms"]) / 1000
    return levels * WINDOWS_PER_LEVEL * window_s + MODEL_OVERHEAD_S


def hours_to_extend(shortfall_s: float) -> int:
    """Whole hours (`fab extend --hours N`) that cover `shortfall_s`."""
    return max(1, math.ceil(shortfall_s / 3600))


def _clock(moment: datetime) -> str:
    return moment.isoformat(timespec="minutes")


def minutes(seconds: float) -> str:
    """Seconds as whole minutes for a message: "13 min"."""
    return f"{max(0, round(seconds / 60))} min"


def check_bench_fits(
    end: datetime, models: int, profile: dict, profile_name: str, margin_minutes: float, now: datetime
) -> None:
    """LeaseTooShort unless `models` models measured from `now` end `margin_minutes` before `end`."""
    needed = models * model_estimate_s(profile)
    margin = margin_minutes * 60
    left = (end - now).total_seconds()
    if needed + margin <= left:
        return
    levels = len(concurrency_levels(profile["concurrency_range"]))
    when = "ended" if left <= 0 else f"ends {_clock(end)}, in {minutes(left)}"
    raise LeaseTooShort(
        f"the lease {when}; this bench needs about {minutes(needed)} ({models} model(s) x {levels} concurrency "
        f"level(s) x {WINDOWS_PER_LEVEL} windows, {profile_name} profile) and a safety margin of "
        f"{minutes(margin)} (lab.bench.lease_margin_minutes), so it would lose its results when the lease ends.\n"
        f"Run `fab extend --hours {hours_to_extend(needed + margin - left)}` first, or bench less (--quick, --model M)."
    )


def next_model_fits(end: datetime, estimate_s: float, margin_minutes: float, now: datetime) -> bool:
    """Whether one more model of `estimate_s` seconds ends `margin_minutes` before `end`."""
    return now + timedelta(seconds=estimate_s + margin_minutes * 60) <= end

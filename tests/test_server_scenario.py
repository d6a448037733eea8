"""The server scenario (fab bench --scenario server): Poisson arrivals against the real tritonserver, and
perf_analyzer's own binary search for the highest rate whose p99 stays within the bound."""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import tritonclient.http as triton_http
from support.serving import classify

from provision import sample_images
from provision.host.tritonserver import perf_analyzer_env
from provision.measure import perf_runs
from provision.perf import (
    ANSWERED_FRACTION,
    DELAYED_LIMIT_PERCENT,
    rate_search_steps,
    rates_tried,
    with_rate_facts,
    write_input_json,
)
from provision.report import write_report
from provision.server_report import rate_words, verdicts

pytestmark = [pytest.mark.triton, pytest.mark.xdist_group("session_triton")]

MODEL = "food_classifier"
DATA = Path(__file__).parent / "data"
# A bound far above one request's latency here (tens of ms) and a range whose top is far beyond what one
# CPU instance serves: the search must cross the bound somewhere inside the range.
BOUND_MS = 250
PROFILE = {
    "name": "quick", "concurrency_range": "1", "request_rate_range": "1:64:1",
    "measurement_mode": "count_windows", "measurement_request_count": 12, "measurement_interval_ms": 2000,
    "stability_percentage": 999, "max_trials": 10,
}  # fmt: skip


def measured_search(run: Path, address: str, triton_runtime, profile: dict, bound_ms: float) -> dict:
    """One search, as fab bench runs it on a host, written as fab bench writes it; the summary."""
    host = run / "hosts" / "local"
    host.mkdir(parents=True)
    (perf,) = perf_runs([MODEL], address, profile=profile, server_p99_ms=bound_ms)
    perf = replace(
        perf, input_json=write_input_json(run / "input.json", [sample_images.jpeg(seed=1)]), csv_path=host / f"{MODEL}.csv"
    )
    done = perf.run(str(Path(sys.executable).parent / "perf_analyzer"), env=perf_analyzer_env(triton_runtime.root), timeout_s=900)
    (host / f"{MODEL}.log").write_text(done.stdout + done.stderr)  # as bench.yml keeps perf_analyzer's output
    return write_report(
        run, run_id="server-run", target="local", profile=profile, commands={MODEL: " ".join(perf.command())},
        smoke_weights=True, git={"commit": None, "dirty": False}, server_p99_ms=bound_ms,
    )  # fmt: skip


@pytest.fixture(scope="module")
def searched(triton_server, triton_runtime, tmp_path_factory) -> dict:
    """One search over 1:64:1 within 250 ms, written as fab bench writes it."""
    address = f"{triton_server.host}:{triton_server.http_port}"
    with triton_http.InferenceServerClient(address) as client:  # the first inference warms the stub
        classify(client, MODEL, [sample_images.b64(sample_images.jpeg(seed=0))])
    run = tmp_path_factory.mktemp("server-run")
    summary = measured_search(run, address, triton_runtime, PROFILE, BOUND_MS)
    (perf,) = perf_runs([MODEL], address, profile=PROFILE, server_p99_ms=BOUND_MS)
    return {"summary": summary, "run": run, "command": perf.command()}


def test_perf_analyzer_is_asked_for_poisson_arrivals_and_its_binary_search_on_p99(searched):
    command = " ".join(searched["command"])
    assert "--request-rate-range 1:64:1 --request-distribution poisson --binary-search --latency-threshold 250" in command
    assert "--percentile=99" in command and "--concurrency-range" not in command


@pytest.mark.parametrize("one_rate", ["8", "8:8", "8:8:1"])
def test_a_range_of_one_rate_is_measured_once_without_the_search(one_rate):
    """The binary search measures both ends of its range: over one rate, the same rate twice."""
    (perf,) = perf_runs(["food_classifier"], "127.0.0.1:8000", profile={**PROFILE, "request_rate_range": one_rate},
                        server_p99_ms=BOUND_MS)  # fmt: skip
    command = " ".join(perf.command())
    assert f"--request-rate-range {one_rate} --request-distribution poisson --latency-threshold 250" in command
    assert "--binary-search" not in command and rate_search_steps(one_rate) == 1
    assert rate_search_steps("8:9:1") == 2, "two rates: the search, both ends"


def test_a_rate_the_log_gives_to_more_decimals_than_the_csv_is_one_rate():
    """Where the binary search halves an interval, perf_analyzer's log says 40.375 and its CSV 40.38."""
    log = "Request Rate: 40.375 inference requests per second\n  Client: \n    Request count: 60\n"
    rows = with_rate_facts([{"request_rate": 40.38, "throughput": 40.0, "p99_us": 90e3}], log)
    assert rates_tried(log) == [40.38] and rows[0]["request_count"] == 60
    assert [rate["request_rate"] for rate in verdicts(rows, rates_tried(log), 250, False)] == [40.38]


def test_every_rate_tried_has_a_verdict_and_a_sustained_one_was_sent_on_schedule_and_answered(searched):
    summary = searched["summary"]
    found = summary["server"]["models"][MODEL]
    assert found["rates_tried"][:2] == [1.0, 64.0], "both ends of the range first"
    assert len(found["rates_tried"]) <= rate_search_steps(PROFILE["request_rate_range"])
    rows = {row["request_rate"]: row for row in summary["models"][MODEL]}
    assert [rate["request_rate"] for rate in found["rates"]] == sorted(found["rates_tried"])
    for rate in found["rates"]:
        row = rows.get(rate["request_rate"])
        if rate["sustained"]:
            assert row["p99_us"] <= BOUND_MS * 1000 and row["delayed_percent"] < DELAYED_LIMIT_PERCENT
            assert row["send_rate"] is None or row["throughput"] >= ANSWERED_FRACTION * row["send_rate"]
        else:
            assert rate["why"], "a rate not sustained says why"
    best = found["sustained"]
    answered = [rows[rate["request_rate"]]["throughput"] for rate in found["rates"] if rate["sustained"]]
    assert (best["throughput"] if best else None) == max(answered, default=None), "the most sent and answered"
    report = (searched["run"] / "report.md").read_text()
    for rate in found["rates"]:
        assert f"| {rate['request_rate']:g} |" in report, "every rate tried is in the table"


def test_the_report_says_the_scenario_and_what_each_rate_was_worth(searched):
    summary, run = searched["summary"], searched["run"]
    assert summary["scenario"] == "server" and summary["server"]["p99_ms"] == BOUND_MS
    report = (run / "report.md").read_text()
    assert "server scenario: Poisson arrivals, rates 1:64:1 searched for p99 <= 250 ms" in report
    assert "| rate asked (requests/s) | sent late | infer/s answered | answered / asked |" in report
    best = summary["server"]["models"][MODEL]["sustained"]
    if best:
        assert sum(best["split_us"].values()) == pytest.approx(best["avg_us"])
        assert f"**{rate_words(best['throughput'])} requests/s sent and answered**, at perf_analyzer's rate" in report
        assert f"Where the average latency goes at {best['request_rate']:g} requests/s (ms):" in report
    assert summary["plots"] == ["server_rates.png"]
    assert (run / "server_rates.png").stat().st_size > 0 and (run / "server_rates.svg").stat().st_size > 0


def test_rates_this_machine_cannot_send_on_schedule_are_reported_late_and_never_sustained(
    triton_server, triton_runtime, tmp_path
):
    """Far above what one CPU instance answers and far below the bound: perf_analyzer warns that it could not
    keep up, and its p99 alone would have called both rates sustainable."""
    address = f"{triton_server.host}:{triton_server.http_port}"
    profile = {**PROFILE, "request_rate_range": "32:64:32"}
    summary = measured_search(tmp_path, address, triton_runtime, profile, bound_ms=5000)
    found = summary["server"]["models"][MODEL]
    rows = summary["models"][MODEL]
    assert rows and all(row["p99_us"] <= 5000 * 1000 for row in rows), "within the bound: p99 alone would count them"
    late = [row for row in rows if row["delayed_percent"] >= DELAYED_LIMIT_PERCENT]
    assert late, "this machine cannot send 32 or 64 requests/s to a CPU classifier on schedule"
    assert found["sustained"] is None or found["sustained"]["request_rate"] not in [row["request_rate"] for row in late]
    report = (tmp_path / "report.md").read_text()
    for row in late:
        assert f"perf_analyzer sent {row['delayed_percent']:g} % of the requests late" in report


def test_a_recorded_search_quotes_what_was_sent_and_answered_and_not_a_rate_sent_late(tmp_path):
    """The search of tests/data/perf_analyzer_request_rate_late.*: p99 within 400 ms at both ends, so
    perf_analyzer's own answer is 32 requests/s; but 32/s went out 76 % late (26.6/s sent), and at 1/s
    its schedule sent 0.46/s, none late."""
    run = tmp_path / "run"
    host = run / "hosts" / "local"
    host.mkdir(parents=True)
    for suffix in (".csv", ".log"):
        shutil.copy(DATA / f"perf_analyzer_request_rate_late{suffix}", host / f"{MODEL}{suffix}")
    summary = write_report(
        run, run_id="r", target="local", profile={**PROFILE, "request_rate_range": "1:32:1"},
        commands={MODEL: "perf_analyzer -m food_classifier"}, smoke_weights=True,
        git={"commit": None, "dirty": False}, server_p99_ms=400,
    )  # fmt: skip
    found = summary["server"]["models"][MODEL]
    assert found["sustained"]["request_rate"] == 1.0
    assert [rate["sustained"] for rate in found["rates"]] == [True, False]
    report = (run / "report.md").read_text()
    assert "**32 requests/s**" not in report and "**23.98" not in report
    assert "**0.46 requests/s sent and answered**, at perf_analyzer's rate 1/s" in report
    assert (
        "It is quoted as sent, not as asked: perf_analyzer asked for 1 requests/s and sent 0.46, none late: its "
        "Poisson schedule is the same every run and starts slow, so over these 37 requests it carried 46% of the rate"
    ) in report
    assert (
        "| 32 | 76.39 % | 23.98 | 0.75 | 128.1 | 189.2 | no: perf_analyzer sent 76.39 % of the requests late "
        "(26.64 requests/s sent of 32 asked): the server fell behind (requests waited 84.4 ms in its queue) |"
    ) in report
    assert "The next rate tried above it, 32 requests/s, was not sustained: perf_analyzer sent 76.39 %" in report


def test_the_rate_plot_draws_p99_against_the_rate_on_a_log_axis_with_the_bound():
    from provision.server_report import rate_figure

    rows = [{"request_rate": rate, "p99_us": p99} for rate, p99 in ((1, 40e3), (8, 90e3), (16, 400e3))]
    figure = rate_figure({MODEL: rows}, 250, "p99 latency under Poisson arrivals", {MODEL: MODEL})
    (axes,) = figure.axes
    assert axes.get_xscale() == "log" and axes.get_ylim()[0] == 0
    assert "offered rate" in axes.get_xlabel() and "ms" in axes.get_ylabel()
    line, bound = axes.get_lines()
    assert list(line.get_xdata()) == [1, 8, 16] and list(line.get_ydata()) == [40, 90, 400]
    assert list(bound.get_ydata()) == [250, 250]


def test_a_model_over_the_bound_at_the_lowest_rate_is_reported_as_such_not_left_out(tmp_path):
    """perf_analyzer stops at the range's start when it is already over the bound, and writes no CSV."""
    run = tmp_path / "run"
    host = run / "hosts" / "local"
    host.mkdir(parents=True)
    (host / "ensemble.log").write_text(
        "Request Rate: 1 inference requests per seconds\n--- stderr ---\nMeasured latency went over the set limit of 300 msec.\n"
    )
    summary = write_report(
        run, run_id="r", target="local", profile=PROFILE, commands={"ensemble": "perf_analyzer -m ensemble"},
        smoke_weights=True, git={"commit": None, "dirty": False}, server_p99_ms=300,
    )  # fmt: skip
    found = summary["server"]["models"]["ensemble"]
    assert found["sustained"] is None and found["rates_tried"] == [1.0]
    report = (run / "report.md").read_text()
    assert "## ensemble" in report
    assert "No rate of 1:64:1 kept p99 within 300 ms, the lowest included (perf_analyzer stopped at 1 requests/s)" in report
    assert summary["plots"] == [], "nothing to draw"

"""The server scenario (fab bench --scenario server): Poisson arrivals against the real tritonserver, and
perf_analyzer's own binary search for the highest rate whose p99 stays within the bound."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import tritonclient.http as triton_http
from support.serving import classify

from provision import sample_images
from provision.host.tritonserver import perf_analyzer_env
from provision.measure import perf_runs
from provision.perf import rate_search_steps, write_input_json
from provision.report import write_report

pytestmark = [pytest.mark.triton, pytest.mark.xdist_group("session_triton")]

MODEL = "food_classifier"
# A bound far above one request's latency here (tens of ms) and a range whose top is far beyond what one
# CPU instance serves: the search must cross the bound somewhere inside the range.
BOUND_MS = 250
PROFILE = {
    "name": "quick", "concurrency_range": "1", "request_rate_range": "1:64:1",
    "measurement_mode": "count_windows", "measurement_request_count": 12, "measurement_interval_ms": 2000,
    "stability_percentage": 999, "max_trials": 10,
}  # fmt: skip


@pytest.fixture(scope="module")
def searched(triton_server, triton_runtime, tmp_path_factory) -> dict:
    """One search, as fab bench runs it on a host, written as fab bench writes it; the summary."""
    address = f"{triton_server.host}:{triton_server.http_port}"
    with triton_http.InferenceServerClient(address) as client:  # the first inference warms the stub
        classify(client, MODEL, [sample_images.b64(sample_images.jpeg(seed=0))])
    run = tmp_path_factory.mktemp("server-run")
    host = run / "hosts" / "local"
    host.mkdir(parents=True)
    (perf,) = perf_runs([MODEL], address, profile=PROFILE, server_p99_ms=BOUND_MS)
    perf = replace(
        perf, input_json=write_input_json(run / "input.json", [sample_images.jpeg(seed=1)]), csv_path=host / f"{MODEL}.csv"
    )
    done = perf.run(str(Path(sys.executable).parent / "perf_analyzer"), env=perf_analyzer_env(triton_runtime.root), timeout_s=900)
    (host / f"{MODEL}.log").write_text(done.stdout + done.stderr)  # as bench.yml keeps perf_analyzer's output
    summary = write_report(
        run, run_id="server-run", target="local", profile=PROFILE, commands={MODEL: " ".join(perf.command())},
        smoke_weights=True, git={"commit": None, "dirty": False}, server_p99_ms=BOUND_MS,
    )  # fmt: skip
    return {"summary": summary, "run": run, "command": perf.command()}


def test_perf_analyzer_is_asked_for_poisson_arrivals_and_its_binary_search_on_p99(searched):
    command = " ".join(searched["command"])
    assert "--request-rate-range 1:64:1 --request-distribution poisson --binary-search --latency-threshold 250" in command
    assert "--percentile=99" in command and "--concurrency-range" not in command


def test_the_search_finds_a_rate_within_the_bound_and_the_next_rate_tried_above_it_is_over_or_the_top(searched):
    summary = searched["summary"]
    found = summary["server"]["models"][MODEL]
    best = found["sustained"]
    assert best is not None, found
    assert best["p99_us"] <= BOUND_MS * 1000
    assert found["rates_tried"][:2] == [1.0, 64.0], "both ends of the range first"
    assert len(found["rates_tried"]) <= rate_search_steps(PROFILE["request_rate_range"])
    rows = {row["request_rate"]: row for row in summary["models"][MODEL]}
    assert best == rows[best["request_rate"]] == max(
        (row for row in rows.values() if row["p99_us"] <= BOUND_MS * 1000), key=lambda row: row["request_rate"]
    )
    if found["next_over"] is None:
        assert found["top_of_range"] and best["request_rate"] == 64
    else:
        above = rows.get(found["next_over"])  # None: no stable measurement there, which counts as over
        assert found["next_over"] > best["request_rate"]
        assert above is None or above["p99_us"] > BOUND_MS * 1000


def test_the_report_says_the_scenario_the_rate_and_where_its_latency_goes(searched):
    summary, run = searched["summary"], searched["run"]
    assert summary["scenario"] == "server" and summary["server"]["p99_ms"] == BOUND_MS
    best = summary["server"]["models"][MODEL]["sustained"]
    assert sum(best["split_us"].values()) == pytest.approx(best["avg_us"])
    report = (run / "report.md").read_text()
    assert "server scenario: Poisson arrivals, rates 1:64:1 searched for p99 <= 250 ms" in report
    assert f"Sustainable rate (Poisson arrivals, p99 <= 250 ms): **{best['request_rate']:g} requests/s**" in report
    assert f"Where the average latency goes at {best['request_rate']:g} requests/s (ms):" in report
    assert summary["plots"] == ["server_rates.png"]
    assert (run / "server_rates.png").stat().st_size > 0 and (run / "server_rates.svg").stat().st_size > 0


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

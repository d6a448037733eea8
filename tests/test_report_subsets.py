"""The report of a bench is written for any subset of what was planned, from nothing up:
a level with no stable measurement is marked as such (never given figures, never zero),
with perf_analyzer's own reason, and the plots are drawn all the same."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from provision.report import write_report

RECORDED_CSV = Path(__file__).parent / "data" / "perf_analyzer_cpu_collect_metrics.csv"  # levels 2, 4, 6
PERF_ANALYZER_GAVE_UP = (
    "Request concurrency: 8\n--- stderr ---\n"
    "Failed to obtain stable measurement within 3 measurement windows for concurrency 8. "
    "Please try to increase the --measurement-request-count.\nFailed to obtain stable measurement.\n"
)
PROFILE = {"name": "quick", "concurrency_range": "2:8:2", "measurement_interval_ms": 1500}


def run_folder(tmp_path: Path, models: dict[str, bool]) -> Path:
    """A bench's folder as the hosts sent it back: {model: whether perf_analyzer wrote a CSV}; each gave up at 8."""
    host = tmp_path / "run" / "hosts" / "local"
    (host / "configs").mkdir(parents=True)
    for model, measured in models.items():
        (host / f"{model}.log").write_text(
            PERF_ANALYZER_GAVE_UP.replace("concurrency 8", "concurrency 2") if not measured else PERF_ANALYZER_GAVE_UP
        )
        if measured:
            shutil.copy(RECORDED_CSV, host / f"{model}.csv")
    return tmp_path / "run"


def write(run: Path, models: list[str], partial: dict | None = None) -> dict:
    return write_report(
        run, run_id="20261207-000000-local", target="local", profile=PROFILE,
        commands={model: f"perf_analyzer -m {model}" for model in models}, smoke_weights=True,
        git={"commit": None, "dirty": False}, partial=partial,
    )  # fmt: skip


def test_levels_without_a_stable_measurement_are_marked_not_zero(tmp_path):
    run = run_folder(tmp_path, {"batching_food_classifier": True})
    summary = write(run, ["batching_food_classifier"])
    assert [row["concurrency"] for row in summary["models"]["batching_food_classifier"]] == [2, 4, 6]
    assert summary["missing_levels"] == {"batching_food_classifier": [8]}
    report = (run / "report.md").read_text()
    assert "| 8 | no stable measurement | - | - | - | - |" in report
    assert (
        'no stable measurement at concurrency 8 (perf_analyzer: "Failed to obtain stable measurement within 3 '
        'measurement windows for concurrency 8. Please try to increase the --measurement-request-count.")'
    ) in report


def test_a_bench_that_measured_nothing_still_has_its_report_and_plots(tmp_path):
    run = run_folder(tmp_path, {"food_classifier": False, "ensemble": False})
    summary = write(run, ["food_classifier", "ensemble"])
    assert summary["models"] == {} and summary["best"] is None
    report = (run / "report.md").read_text()
    assert report.count("Not measured: no stable measurement at concurrency 2, 4, 6, 8 (perf_analyzer:") == 2
    assert "Best configuration" not in report
    for plot in ("throughput.png", "latency.png"):
        assert (run / plot).stat().st_size > 0
    assert json.loads((run / "summary.json").read_text())["plots"] == ["throughput.png", "latency.png"]


def test_a_partial_bench_says_why_and_what_was_not_measured(tmp_path):
    run = run_folder(tmp_path, {"food_classifier": True})
    reason = "perf_analyzer failed on ensemble (exit 99: Couldn't connect to server); Triton stopped answering"
    summary = write(run, ["food_classifier"], partial={"reason": reason, "not_measured": ["ensemble"]})
    assert summary["partial"] == {"reason": reason, "not_measured": ["ensemble"]}
    line = f"The bench stopped early ({reason}); not measured: ensemble."
    assert line in (run / "PARTIAL.md").read_text() and line in (run / "report.md").read_text()


def test_the_throughput_plot_starts_at_zero_on_its_integer_levels():
    from provision.report import throughput_figure

    rows = [{"concurrency": c, "throughput": t} for c, t in ((2, 40.0), (4, 56.0))]
    figure = throughput_figure({"batching_food_classifier": rows}, " (SMOKE WEIGHTS)")
    (axes,) = figure.axes
    assert axes.get_ylim()[0] == 0, "40 -> 56 must not look like double"
    assert list(axes.get_xticks()) == [2, 4], "concurrency is discrete"
    assert axes.get_xlabel() == "concurrency (requests in flight)" and axes.get_ylabel() == "throughput (infer/s)"
    assert axes.get_title().endswith("(SMOKE WEIGHTS)")


def test_on_a_host_without_gpus_the_gpu_variants_say_they_ran_on_the_cpu(tmp_path):
    run = run_folder(tmp_path, {"food_classifier": True, "gpu_food_classifier": True})
    (run / "hosts" / "local" / "host.json").write_text(json.dumps({"gpus": []}))
    summary = write(run, ["food_classifier", "gpu_food_classifier"])
    assert summary["ran_on_the_cpu"] == ["gpu_food_classifier"]
    report = (run / "report.md").read_text()
    assert "## gpu_food_classifier (on the CPU: no GPU on this host)" in report
    assert "## food_classifier\n" in report, "the CPU variant needs no note"


def test_every_figure_is_also_an_svg_with_the_run_it_shows_on_it(tmp_path):
    run = run_folder(tmp_path, {"batching_food_classifier": True})
    summary = write(run, ["batching_food_classifier"])
    for png in summary["plots"]:
        svg = (run / png).with_suffix(".svg").read_text()
        assert "run 20261207-000000-local · host local · quick profile" in svg, png
        assert "Throughput vs concurrency" in svg or png != "throughput.png", "text kept as text"


def test_throughput_against_p99_is_one_curve_per_model_with_each_point_s_concurrency():
    from provision.report import throughput_vs_latency_figure

    rows = [{"concurrency": c, "throughput": t, "p99_us": p} for c, t, p in ((2, 40.0, 60e3), (4, 56.0, 90e3))]
    figure = throughput_vs_latency_figure({"batching_food_classifier": rows, "food_classifier": rows[:1]}, "")
    (axes,) = figure.axes
    curves = {line.get_label(): list(zip(line.get_xdata(), line.get_ydata())) for line in axes.get_lines()}
    assert curves == {"batching_food_classifier": [(60.0, 40.0), (90.0, 56.0)], "food_classifier": [(60.0, 40.0)]}
    assert [text.get_text() for text in axes.texts] == ["c=2", "c=4", "c=2"]
    assert axes.get_xlabel() == "p99 latency (ms)" and axes.get_ylim()[0] == 0 and axes.get_xlim()[0] == 0

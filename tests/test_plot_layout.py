"""The report's plots read right with five models: no title runs into another, no legend covers the lines,
no point label covers another. Checked on the artists' extents as matplotlib lays them out, not on pixels."""

from __future__ import annotations

import itertools

from provision.model_repo import gpu_variants
from provision.report import latency_figure
from provision.tune import Candidate, pareto_figure

FIVE = ["food_classifier", "gpu_food_classifier", "batching_food_classifier", "multigpu_food_classifier", "ensemble"]


def rows(scale: float) -> list[dict]:
    return [
        {"concurrency": c, "throughput": 10 * c * scale, "p50_us": 4e4 * c, "p90_us": 5e4 * c, "p95_us": 6e4 * c,
         "p99_us": 7e4 * c}
        for c in (2, 4)
    ]  # fmt: skip


def extents(figure, texts) -> list:
    renderer = figure.canvas.get_renderer()
    return [text.get_window_extent(renderer) for text in texts if text.get_text()]


def overlapping(boxes) -> list[tuple[int, int]]:
    return [(a, b) for (a, one), (b, other) in itertools.combinations(enumerate(boxes), 2) if one.overlaps(other)]


def test_five_panels_of_latency_keep_their_titles_apart_on_a_cpu_host():
    models = {model: rows(1 + n) for n, model in enumerate(FIVE)}
    on_cpu = [model for model in FIVE if model in gpu_variants()]  # the longest titles: "(on the CPU: ...)"
    assert on_cpu, "the GPU variants are named on a CPU host"
    figure = latency_figure(models, " (SMOKE WEIGHTS)", on_cpu)
    figure.canvas.draw()
    titles = [panel.title for panel in figure.axes]
    assert len(titles) == 5 and all("\n" in t.get_text() for t in titles if "on the CPU" in t.get_text())
    assert overlapping(extents(figure, titles)) == []


def test_compare_s_legend_sits_beside_the_lines_and_its_ticks_are_the_levels(tmp_path):
    from provision.config import client_script

    compare_runs = client_script("compare_runs")
    runs = [{"run_id": run, "models": {model: rows(1) for model in FIVE}} for run in ("a", "b")]
    assert compare_runs.plot(runs, tmp_path / "compare.png").stat().st_size > 0
    figure = compare_runs.figure(runs)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    left, right = figure.axes
    legend = right.get_legend().get_window_extent(renderer)
    for axes in (left, right):
        assert not legend.overlaps(axes.get_window_extent(renderer)), "the legend is outside the plotting area"
        assert list(axes.get_xticks()) == [2, 4], "only the levels measured, whole numbers"


def test_pareto_labels_of_candidates_measured_at_the_same_place_do_not_cover_each_other():
    candidates = [
        Candidate(number, {"max_batch_size": number}, [{"concurrency": 2, "throughput": 30.0 + number * 0.01,
                                                         "p99_us": 80e3 + number * 10}])
        for number in range(1, 9)
    ]  # fmt: skip
    figure = pareto_figure(candidates, 100, "batching_food_classifier on local")
    figure.canvas.draw()
    (axes,) = figure.axes
    labels = [text for text in axes.texts]
    assert sorted(int(n) for label in labels for n in label.get_text().split(", ")) == list(range(1, 9))
    assert overlapping(extents(figure, labels)) == []

"""fab tune's search, on a table of figures instead of a host (provision.tune.search is pure).

The measurements themselves (a real Triton, real perf_analyzer) are in tests/test_tune.py;
here: which configurations the greedy search measures, when it stops growing a setting,
and how it picks the best within the budget.
"""

from __future__ import annotations

from provision.tune import VALUES, Candidate, confirmed, grid_size, search, values_to_try

BASELINE = {
    "max_batch_size": 16,
    "preferred_batch_size": [4, 8],
    "max_queue_delay_us": 100,
    "instance_count": 1,
    "gpus": 1,
}


def measure_with(figures):
    """A measure(settings) that reports figures(settings) -> [(concurrency, infer/s, p99 ms)]."""
    measured: list[dict] = []

    def measure(settings: dict) -> Candidate:
        measured.append(settings)
        rows = [
            {"concurrency": c, "throughput": t, "p50_us": p * 500, "p95_us": p * 900, "p99_us": p * 1000}
            for c, t, p in figures(settings)
        ]
        return Candidate(len(measured), settings, rows)

    return measure, measured


def test_a_setting_stops_growing_when_the_throughput_stops_rising():
    # Two instances double the throughput, a third adds nothing: 3 and 4 are never both tried.
    def figures(s):
        return [(4, {1: 40, 2: 80, 3: 81, 4: 82}[s["instance_count"]] + s["max_batch_size"] / 100, 50)]

    measure, measured = measure_with(figures)
    values = VALUES["full"]
    candidates, best = search(measure, BASELINE, budget_ms=100, values=values, gpu_count=1)
    instance_counts = [s["instance_count"] for s in measured]
    assert 3 in instance_counts and 4 not in instance_counts
    assert best.settings["instance_count"] == 2
    assert len(candidates) < grid_size(BASELINE, values, gpu_count=1)


def test_a_value_that_breaks_the_budget_stops_the_setting_and_is_not_chosen():
    # Bigger batches raise throughput but past 8 the p99 breaks the 100 ms budget.
    def figures(s):
        size = s["max_batch_size"]
        return [(8, 10 * size, 40 if size <= 8 else 150)]

    measure, measured = measure_with(figures)
    candidates, best = search(measure, BASELINE, budget_ms=100, values=VALUES["full"], gpu_count=1)
    sizes = [s["max_batch_size"] for s in measured]
    assert 32 not in sizes, "16 broke the budget: 32 is not tried"
    assert best.settings["max_batch_size"] == 8 and best.score(100) == 80
    assert all(size <= 8 for size in best.settings["preferred_batch_size"]), "preferred sizes follow max_batch_size"


def test_the_score_is_the_best_throughput_at_a_concurrency_within_the_budget():
    rows = [(1, 30, 20), (4, 60, 90), (8, 70, 200)]
    (candidate,) = [measure_with(lambda s: rows)[0](BASELINE)]
    assert candidate.score(100) == 60 and candidate.best_row(100)["concurrency"] == 4
    assert candidate.score(10) == 0 and candidate.best_row(10) is None
    assert candidate.closest_row()["concurrency"] == 1, "a miss is described by its lowest p99"


def test_what_a_model_or_host_lacks_is_not_searched():
    no_batching = {"instance_count": 1}
    assert values_to_try("max_batch_size", no_batching, VALUES["quick"], gpu_count=2) == []
    assert values_to_try("gpus", BASELINE, VALUES["quick"], gpu_count=1) == [], "one GPU: nothing to vary"
    assert values_to_try("gpus", BASELINE, VALUES["quick"], gpu_count=2) == [1, 2]
    assert values_to_try("preferred_batch_size", BASELINE, VALUES["quick"], gpu_count=0) == [[16], [8, 16]]
    assert values_to_try("preferred_batch_size", {**BASELINE, "max_batch_size": 2}, VALUES["quick"], 0) == [[2]]
    assert grid_size(no_batching, VALUES["full"], gpu_count=0) == len(VALUES["full"]["instance_count"])


def test_the_pareto_plot_names_its_model_host_and_run_and_numbers_its_candidates():
    from provision.tune import pareto_figure

    candidates = [
        Candidate(1, {"max_batch_size": 4}, [{"concurrency": 2, "throughput": 30.0, "p99_us": 80e3}]),
        Candidate(2, {"max_batch_size": 8}, [{"concurrency": 2, "throughput": 45.0, "p99_us": 120e3}]),
    ]
    figure = pareto_figure(candidates, 100, "batching_food_classifier on local, run 20261207-000000-local")
    (axes,) = figure.axes
    assert axes.get_title() == "fab tune: batching_food_classifier on local, run 20261207-000000-local"
    assert [text.get_text() for text in axes.texts] == ["1", "2"], "each point numbered as candidates.csv does"
    assert axes.get_ylim()[0] == 0 and axes.get_xlabel() == "p99 latency (ms)"
    assert pareto_figure([Candidate(3, {}, [])], 100, "x") is None, "nothing measured: no figure"


SERVER_ROWS = [  # the server scenario's rows: the Poisson rates perf_analyzer's binary search measured stably
    {"request_rate": 4.0, "throughput": 3.9, "p50_us": 40e3, "p95_us": 70e3, "p99_us": 80e3},
    {"request_rate": 8.0, "throughput": 7.5, "p50_us": 60e3, "p95_us": 130e3, "p99_us": 150e3},
    {"request_rate": 16.0, "throughput": 9.0, "p50_us": 400e3, "p95_us": 800e3, "p99_us": 900e3},
]


def test_with_the_server_scenario_a_candidate_is_worth_the_highest_rate_sent_and_answered_within_the_budget():
    candidate = Candidate(1, {"max_batch_size": 8}, SERVER_ROWS)
    assert candidate.score(200) == 7.5 and candidate.best_row(200)["request_rate"] == 8.0
    assert candidate.score(50) == 0, "no rate within 50 ms"
    assert candidate.describe(200) == (
        "max_batch_size 8: 7.5 requests/s sent and answered (asked: 8/s), p99 150.0 ms at 8 requests/s (Poisson)"
    )


def test_a_rate_perf_analyzer_sent_late_is_worth_nothing_to_a_tune():
    late = [{**SERVER_ROWS[1], "delayed_percent": 40.0, "send_rate": 6.0}]
    assert Candidate(1, {"max_batch_size": 8}, late).score(200) == 0


def test_the_server_scenario_s_tune_report_says_rates_not_concurrencies():
    from provision.tune import figures, pareto_figure, report_section

    best, deployed = Candidate(2, {"max_batch_size": 8}, SERVER_ROWS), Candidate(1, {"max_batch_size": 4}, SERVER_ROWS[:1])
    summary = {
        "model": "batching_food_classifier", "host": "local", "target": "local", "runtime": "process",
        "budget_p99_ms": 200, "search": "quick", "concurrency_range": "2:4:2", "scenario": "server",
        "load": "server scenario: Poisson arrivals, rates 1:32:1 searched", "settings": best.settings,
        "measured": figures(best.best_row(200)), "deployed": {"settings": deployed.settings, **figures(deployed.best_row(200))},
        "measured_again": None, "configurations_measured": 2, "configurations_in_grid": 4, "wall_s": 60,
    }  # fmt: skip
    text = report_section(summary, [deployed, best], None)
    assert "Budget: p99 <= 200 ms (server scenario: Poisson arrivals, rates 1:32:1 searched)" in text
    assert "**7.5 requests/s sent and answered** at 8 requests/s (Poisson), p99 150.0 ms" in text
    assert "(the deployed configuration: 3.9 requests/s sent and answered within the budget, 1.92x)" in text
    assert "| 2 | max_batch_size 8 | yes | 8 requests/s (Poisson) | 7.5 |" in text
    assert "| 1 | max_batch_size 4 (deployed) | yes |" in text, "the deployed configuration is marked"
    assert "| # | settings | within budget | measured at |" in text
    assert "- target: local, host: local, process runtime" in text
    (axes,) = pareto_figure([deployed, best], 200, "x").axes
    assert axes.get_ylabel() == "sustained rate (requests/s sent and answered, Poisson)"


def test_the_tune_report_has_the_bench_s_banner_and_one_rounding_of_the_spread():
    from provision.tune import figures, report_section

    best = Candidate(2, {"max_batch_size": 8}, SERVER_ROWS)
    best.worths = [113.849, 113.851, 120.0]
    summary = {
        "model": "batching_food_classifier", "host": "local", "target": "local", "runtime": "process",
        "budget_p99_ms": 200, "search": "quick", "concurrency_range": "2:4:2", "scenario": "closed_loop",
        "settings": best.settings, "measured": {**figures(best.best_row(200)), "median_of": 3, "spread": list(best.spread())},
        "deployed": {"settings": {"max_batch_size": 4}}, "measured_again": None, "configurations_measured": 1,
        "configurations_in_grid": 4, "wall_s": 60, "smoke_weights": True, "git": {"commit": "abc", "dirty": False},
    }  # fmt: skip
    text = report_section(summary, [best], None)
    assert "> **SMOKE WEIGHTS**" in text and "- git commit: abc" in text
    assert best.spread() == (113.85, 120.0)
    assert text.count("median of 3: 113.8 to 120.0") + text.count("median of 3: 113.9 to 120.0") == 2, (
        "the report's two spreads of one candidate read alike"
    )


def test_the_quick_load_reaches_every_batch_size_it_searches_or_the_size_is_left_out_saying_why():
    from provision.tune import searched_values

    values, said = searched_values("quick", None, "2:4:2", server=False)
    assert values["max_batch_size"] == [4], "at most 4 requests in flight: 8 and 16 cannot fill"
    assert said.startswith("max_batch_size 8, 16 left out: at concurrency 2:4:2 no more than 4 requests")
    assert "the rule: batch sizes up to the highest concurrency" in said
    values, said = searched_values("quick", None, "2:16:2", server=False)
    assert values["max_batch_size"] == VALUES["quick"]["max_batch_size"] and said == ""
    values, said = searched_values("quick", [2, 32], "1:8:1", server=False)
    assert values["max_batch_size"] == [2] and "32 left out" in said
    values, said = searched_values("quick", None, "2:4:2", server=True)
    assert values["max_batch_size"] == VALUES["quick"]["max_batch_size"], "Poisson arrivals have no such ceiling"


def test_a_winner_that_loses_the_side_by_side_measurement_is_not_recommended_and_the_deployed_settings_stay():
    from provision.tune import _deployed_stays, confirmed, figures, report_section

    deployed_settings, best_settings = {"max_batch_size": 4}, {"max_batch_size": 8}
    row = {"concurrency": 4, "p50_us": 50e3, "p95_us": 80e3, "p99_us": 90e3}
    search_best = Candidate(2, best_settings, [{**row, "throughput": 53.9}])
    search_deployed = Candidate(1, deployed_settings, [{**row, "throughput": 43.6}])
    again = [Candidate(3, best_settings, [{**row, "throughput": 25.9}]), Candidate(4, deployed_settings, [{**row, "throughput": 33.3}])]
    assert not confirmed(again, 100)
    assert confirmed([again[1], again[0]], 100), "a lead beyond 5 % holds"
    assert not confirmed([Candidate(5, {}, [{**row, "throughput": 34.0}]), again[1]], 100), "2 % is noise"
    summary = {
        "model": "batching_food_classifier", "host": "local", "target": "local", "runtime": "process",
        "budget_p99_ms": 100, "search": "quick", "concurrency_range": "2:4:2", "settings": best_settings,
        "measured": figures(search_best.best_row(100)),
        "deployed": {"settings": deployed_settings, **figures(search_deployed.best_row(100))},
        "measured_again": {"best": figures(again[0].best_row(100)), "deployed": figures(again[1].best_row(100))},
        "configurations_measured": 2, "configurations_in_grid": 4, "wall_s": 60,
    }  # fmt: skip
    summary.update(_deployed_stays(summary, again, 100))
    assert summary["recommended"] is False and summary["settings"] == deployed_settings, "best.json deploys what is there"
    assert summary["rejected"]["settings"] == best_settings and summary["measured"]["throughput"] == 33.3
    assert summary["verdict"].startswith("not recommended: measured again side by side, the best (25.9 infer/s)")
    text = report_section(summary, [search_deployed, search_best, *again], None)
    assert "**Not recommended: measured again side by side" in text and "Deploy it:" not in text
    assert "Best: max_batch_size 8: **53.9 infer/s**" in text
    # A re-measurement that gave no row (Triton refused the config, nothing stable) is said as such.
    unmeasured = Candidate(6, best_settings, [], error="no stable measurement at concurrency 2")
    stays = _deployed_stays(summary, [unmeasured, again[1]], 100)
    assert stays["verdict"].startswith("not recommended: measured again side by side, the best (not measured: no stable")
    summary.update(stays, measured_again={"best": None, "deployed": figures(again[1].best_row(100))})
    assert "Measured again, side by side: the best not measured, the deployed 33.3 infer/s (p99 90.0 ms at concurrency 4)." in report_section(summary, [unmeasured], None)


def measured(number: int, settings: dict, throughputs: list[float], budget_ms: float = 100) -> Candidate:
    """A candidate measured once per throughput given (each measurement one row at concurrency 4)."""
    candidate = Candidate(number, settings)
    row = {"concurrency": 4, "p50_us": 50e3, "p95_us": 80e3, "p99_us": 90e3}
    candidate.keep_median([[{**row, "throughput": value}] for value in throughputs], budget_ms)
    return candidate


def test_a_candidate_is_worth_the_median_of_its_measurements_and_its_figures_are_that_measurements_own():
    candidate = measured(1, {"max_batch_size": 4}, [48.0, 61.5, 52.0])
    assert candidate.score(100) == 52.0 and candidate.rows[0]["throughput"] == 52.0
    assert candidate.spread() == (48.0, 61.5)
    assert "52.0 infer/s (median of 3: 48.0 to 61.5), p99 90.0 ms at concurrency 4" in candidate.describe(100)
    assert candidate.figures(candidate.best_row(100))["spread"] == [48.0, 61.5]
    assert measured(2, {}, [40.0, 50.0]).score(100) == 40.0, "an even count: the lower middle one"
    assert measured(3, {}, [44.0]).spread() is None and "median" not in measured(3, {}, [44.0]).describe(100)
    # A measurement with no row within the budget is worth 0 and takes its place in the order.
    over = {"concurrency": 4, "p50_us": 50e3, "p95_us": 80e3, "p99_us": 900e3, "throughput": 99.0}
    candidate = Candidate(4, {})
    candidate.keep_median([[over], [over], [{**over, "p99_us": 90e3}]], 100)
    assert candidate.score(100) == 0 and candidate.best_row(100) is None


def test_a_lead_is_beyond_the_noise_only_when_the_medians_differ_by_5_percent_and_the_spreads_do_not_overlap():
    deployed = measured(1, {"max_batch_size": 16}, [50.0, 52.0, 51.0])
    assert confirmed([measured(2, {"max_batch_size": 4}, [56.0, 57.0, 58.0]), deployed], 100)
    overlapping = measured(3, {"max_batch_size": 4}, [51.5, 57.0, 58.0])  # median 10 % up, one measurement below 52
    assert not confirmed([overlapping, deployed], 100)
    assert not confirmed([measured(4, {"max_batch_size": 4}, [53.0, 53.0, 53.5]), deployed], 100), "2 % up"

"""Where the latency goes: perf_analyzer's split of the average, carried into summary.json, the report
(tests/test_gpu_metrics.py) and `fab compare`. (The split adds up to perf_analyzer's own average:
tests/test_perf_analyzer.py, against the real server.)"""

from __future__ import annotations

from provision.config import client_script

compare_runs = client_script("compare_runs")

A = {"client_send": 100, "network_and_server_send_recv": 400, "server_queue": 2000, "server_compute_input": 30,
     "server_compute_infer": 20000, "server_compute_output": 150, "client_recv": 0}  # fmt: skip


def run(run_id: str, split: dict) -> dict:
    return {
        "run_id": run_id,
        "models": {"batching_food_classifier": [{"concurrency": 4, "throughput": 50.0, "p95_us": 30e3,
                                                 "p99_us": 31e3, "split_us": split}]},  # fmt: skip
    }


def test_compare_names_the_part_of_the_latency_that_grew():
    later = {**A, "server_queue": 9000}  # the queue grew by 7 ms, nothing else moved
    runs = [run("a", A), run("b", later)]
    (change,) = compare_runs.split_changes(runs, compare_runs.side_by_side(runs))
    assert change == {
        "run": "b", "model": "batching_food_classifier", "concurrency": 4, "part": "server_queue",
        "change_us": 7000, "average_change_us": 7000,
    }  # fmt: skip


def test_runs_without_a_split_are_compared_as_before():
    runs = [run("a", {}), run("b", A)]
    assert compare_runs.split_changes(runs, compare_runs.side_by_side(runs)) == []

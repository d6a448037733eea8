"""perf_analyzer 2.51 (tritonclient wheel) against the real server, CSV parsed."""

from __future__ import annotations

import sys
from pathlib import Path

from provision import sample_images
from provision.local_triton import perf_analyzer_env
from provision.perf import PerfRun, parse_csv, write_input_json


def test_perf_analyzer_measures_the_batching_classifier(triton_server, triton_runtime, tmp_path):
    perf_analyzer = str(Path(sys.executable).parent / "perf_analyzer")  # from the tritonclient wheel
    images = [sample_images.b64(sample_images.jpeg(seed=seed)) for seed in range(3)]
    run = PerfRun(
        model="batching_food_classifier",
        url=f"{triton_server.host}:{triton_server.http_port}",
        input_json=write_input_json(tmp_path / "input.json", images),
        csv_path=tmp_path / "perf.csv",
        concurrency_range="1:4:3",
        # Short windows of 10 requests each (a time window can come back empty on
        # a busy machine), and the first windows accepted as they are: the
        # figures are not what this test checks; the benchmark does.
        measurement_mode="count_windows",
        measurement_request_count=10,
        stability_percentage=999,
        max_trials=3,
    )
    run.run(perf_analyzer, env=perf_analyzer_env(triton_runtime.root), timeout_s=300)

    rows = parse_csv(run.csv_path)
    assert [row["concurrency"] for row in rows] == [1, 4]
    for row in rows:
        assert row["throughput"] > 0
        assert 0 < row["p50_us"] <= row["p90_us"] <= row["p95_us"] <= row["p99_us"]

"""GPU metrics from perf_analyzer --collect-metrics --verbose-csv: the command line, parse_csv, the report.

The CSVs under tests/data/ were written by the real perf_analyzer 2.51 (tests/data/README.md).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from provision.perf import GPU_COLUMNS, PerfRun, metrics_url, parse_csv, parse_gpu_field
from provision.report import write_report

DATA = Path(__file__).parent / "data"
TWO_GPUS = DATA / "perf_analyzer_2gpu_metrics.csv"
CPU_HOST = DATA / "perf_analyzer_cpu_collect_metrics.csv"
GPU_A = "GPU-3f2a9c4e-8b1d-4e7a-9c05-6d2e1f7a8b90"
GPU_B = "GPU-b7e4d1a2-5c3f-4a9e-8d16-0f9c2b3e4a51"
METRICS_FLAGS = [
    "--collect-metrics",
    "--metrics-url",
    "triton:8002/metrics",
    "--metrics-interval",
    "500",
    "--verbose-csv",
]


def perf_run(**options) -> PerfRun:
    return PerfRun(model="m", url="triton:8000", input_json=Path("input.json"), csv_path=Path("m.csv"), **options)


def test_the_command_line_asks_for_gpu_metrics_only_when_given_a_metrics_url():
    plain = perf_run().command()
    assert not {"--collect-metrics", "--metrics-url", "--metrics-interval", "--verbose-csv"} & set(plain)

    command = perf_run(metrics_url=metrics_url("triton"), metrics_interval_ms=500, extra_args=["--async"]).command()
    assert command[: len(plain)] == plain, "the same command, with the metrics flags after it"
    assert command[len(plain) :] == [*METRICS_FLAGS, "--async"]
    assert perf_run(metrics_url="h:9002/metrics").metrics_args() == [
        "--collect-metrics",
        "--metrics-url",
        "h:9002/metrics",
        "--metrics-interval",
        "1000",  # perf_analyzer's own default
        "--verbose-csv",
    ]
    assert perf_run().metrics_args() == []


def test_a_gpu_field_is_one_uuid_value_pair_per_gpu():
    assert parse_gpu_field(f"{GPU_A}:0.5;{GPU_B}:0.97;") == {GPU_A: 0.5, GPU_B: 0.97}
    assert parse_gpu_field(f"{GPU_A}:17071734784") == {GPU_A: 17071734784.0}, "no trailing ';'"
    assert parse_gpu_field("GPU-x:1e-05;") == {"GPU-x": 1e-05}, "a double as the stream writes a small one"
    assert parse_gpu_field("") == {} and parse_gpu_field(None) == {}
    with pytest.raises(ValueError):
        parse_gpu_field("0.5;")


def test_parse_csv_reads_the_gpu_metrics_of_a_two_gpu_host():
    header = TWO_GPUS.read_text().splitlines()[0].split(",")
    assert header[-6:] == ["request/response", "response wait", *GPU_COLUMNS]

    rows = parse_csv(TWO_GPUS)
    assert [row["concurrency"] for row in rows] == [2, 4, 6]
    first = rows[0]
    assert first["throughput"] == pytest.approx(3.62853) and first["p95_us"] == 1787460
    assert first["gpus"] == {
        GPU_A: {
            "utilization": 0.672671,
            "power_w": 75.6875,
            "memory_used_bytes": 2662334464,
            "memory_total_bytes": 17071734784,
        },
        GPU_B: {
            "utilization": 0.576461,
            "power_w": 66.3875,
            "memory_used_bytes": 2419589120,
            "memory_total_bytes": 17071734784,
        },
    }
    assert isinstance(first["gpus"][GPU_A]["memory_used_bytes"], int)
    assert [row["gpus"][GPU_A]["power_w"] for row in rows] == [75.6875, 139.878, 189.395]
    assert all(list(row["gpus"]) == [GPU_A, GPU_B] for row in rows)


def test_without_gpu_metrics_rows_parse_as_before(tmp_path):
    plain = tmp_path / "plain.csv"
    plain.write_text(
        "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
        "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
        "4,50.4914,108,414,58448,26,19590,160,0,78861,82207,83996,87613\n"
        "2,46.822,126,484,20609,30,21028,178,0,42375,46027,47094,49421\n"
    )
    rows = parse_csv(plain)
    assert rows[0] == {
        "concurrency": 2,
        "throughput": 46.822,
        "p50_us": 42375.0,
        "p90_us": 46027.0,
        "p95_us": 47094.0,
        "p99_us": 49421.0,
        "server_queue_us": 20609.0,
        "server_compute_infer_us": 21028.0,
        "avg_us": 126 + 484 + 20609 + 30 + 21028 + 178 + 0,
        "split_us": {  # where the average went, part by part
            "client_send": 126.0, "network_and_server_send_recv": 484.0, "server_queue": 20609.0,
            "server_compute_input": 30.0, "server_compute_infer": 21028.0, "server_compute_output": 178.0,
            "client_recv": 0.0,
        },
    }  # fmt: skip
    # A CPU host with --collect-metrics: the GPU columns are there, empty.
    cpu = parse_csv(CPU_HOST)
    assert [row["concurrency"] for row in cpu] == [2, 4, 6]
    assert not any("gpus" in row for row in cpu)
    assert set(cpu[0]) == set(rows[0])


def _results(tmp_path: Path, csvs: dict[str, Path], commands: dict[str, str]) -> tuple[Path, dict]:
    results = tmp_path / "run"
    host = results / "hosts" / "gpu-host"
    host.mkdir(parents=True)
    for model, csv in csvs.items():
        shutil.copy(csv, host / f"{model}.csv")
    summary = write_report(
        results,
        run_id="run",
        target="ssh",
        profile={"name": "quick", "concurrency_range": "2:6:2", "measurement_interval_ms": 2000},
        commands=commands,
        smoke_weights=False,
        git={"commit": None, "dirty": False},
    )
    return results, summary


def test_the_report_shows_the_gpu_metrics_where_collected(tmp_path):
    command = "perf_analyzer -m multigpu_food_classifier " + " ".join(METRICS_FLAGS)
    results, summary = _results(tmp_path, {"multigpu_food_classifier": TWO_GPUS}, {"multigpu_food_classifier": command})

    saved = json.loads((results / "summary.json").read_text())
    assert saved["gpu_metrics"]["collected"] is True and saved["gpu_metrics"]["gpus"] == [GPU_A, GPU_B]
    assert set(saved["gpu_metrics"]["units"]) == {"utilization", "power_w", "memory_used_bytes", "memory_total_bytes"}
    rows = saved["models"]["multigpu_food_classifier"]
    assert rows[0]["concurrency"] == 2 and rows[0]["gpus"][GPU_B]["utilization"] == 0.576461
    assert rows[2]["gpus"][GPU_A]["memory_used_bytes"] == 2775580672

    report = (results / "report.md").read_text()
    assert "- GPU metrics: 2 GPU(s)" in report
    assert "| concurrency | GPU | utilisation % | memory used / total MiB | power W |" in report
    # 2662334464 B = 2539 MiB of 17071734784 B = 16281 MiB.
    assert "| 2 | GPU-3f2a9c4e | 67.3 | 2539 / 16281 | 75.7 |" in report
    assert "| 6 | GPU-b7e4d1a2 | 90.0 | 2362 / 16281 | 157.3 |" in report
    assert "| 2 | 3.6 |" in report, "the throughput table is still there"
    # Where the latency went, from the same CSV (microseconds there, ms here): queue 182.0, compute infer 358.6.
    assert "| concurrency | client send | network + server send/recv | queue | compute input | compute infer |" in report
    assert "| 2 | 0.12 | 1.80 | 181.97 | 0.05 | 358.63 | 0.69 | 0.00 | 543.26 |" in report
    assert rows[0]["split_us"]["server_queue"] == 181974 and rows[0]["avg_us"] == sum(rows[0]["split_us"].values())
    assert "latency_breakdown.png" in summary["plots"] and (results / "latency_breakdown.png").stat().st_size > 0
    assert "gpu_utilization.png" in summary["plots"] and (results / "gpu_utilization.png").stat().st_size > 0
    assert "![GPU utilisation](gpu_utilization.png)" in report


def test_the_report_says_when_no_gpu_metrics_were_collected(tmp_path):
    command = "perf_analyzer -m batching_food_classifier " + " ".join(METRICS_FLAGS)
    results, summary = _results(tmp_path, {"batching_food_classifier": CPU_HOST}, {"batching_food_classifier": command})
    assert summary["gpu_metrics"] == {"collected": False, "gpus": [], "units": summary["gpu_metrics"]["units"]}
    report = (results / "report.md").read_text()
    assert "GPU metrics: none collected (perf_analyzer asked for them, but Triton reported no GPUs" in report
    assert "| GPU |" not in report
    assert summary["plots"] == ["throughput.png", "latency.png", "throughput_vs_latency.png", "latency_breakdown.png"]
    assert not (results / "gpu_utilization.png").exists()

    results, _ = _results(tmp_path / "plain", {"food_classifier": CPU_HOST}, {"food_classifier": "perf_analyzer -m x"})
    assert (
        "GPU metrics: none collected (CPU host: perf_analyzer ran without --collect-metrics)"
        in (results / "report.md").read_text()
    )


def test_a_model_perf_analyzer_could_not_measure_is_named_and_the_others_are_reported(tmp_path):
    # perf_analyzer stops without a CSV when no window of the first level is stable (a busy host).
    commands = {"batching_food_classifier": "perf_analyzer -m batching_food_classifier", "gpu_food_classifier": "x"}
    results, summary = _results(tmp_path, {"batching_food_classifier": CPU_HOST}, commands)
    assert list(summary["models"]) == ["batching_food_classifier"]
    assert summary["missing_levels"] == {"gpu_food_classifier": [2, 4, 6]}
    report = (results / "report.md").read_text()
    assert "## gpu_food_classifier" in report
    assert "Not measured: no stable measurement at concurrency 2, 4, 6" in report
    assert "hosts/gpu-host/gpu_food_classifier.log" in report
    assert summary["best"]["model"] == "batching_food_classifier"

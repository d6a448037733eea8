"""perf_analyzer against one model, as `fab bench` runs it: its command line (PerfRun) and its CSV read
back (parse_csv), plus Triton's own statistics of a model (model_statistics, statistics_table).

perf_analyzer (from the tritonclient 2.51.0 wheel) measures throughput and latency percentiles of a
model at a range of concurrencies (or, for the server scenario, of Poisson request rates). Its `-f`
CSV has one row per level, sorted by throughput (not by level), times in microseconds; `parse_csv`
turns it into rows sorted by level. On GPU hosts it can also record Triton's GPU metrics per level
(`PerfRun(metrics_url=...)`: --collect-metrics --verbose-csv); `parse_csv` puts them under
row["gpus"], one entry per GPU UUID.

One copy for everyone who runs perf_analyzer: the controller (provision/perf.py hands these out,
bench.yml runs PerfRun's command line on the hosts), and profiling.ipynb, which profiles the models
itself on the host where Jupyter runs. Standard library only.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

# CSV header -> our field name.
_COLUMNS = {
    "Concurrency": "concurrency",
    "Request Rate": "request_rate",  # the server scenario's rows: the offered rate, requests per second
    "Inferences/Second": "throughput",
    "p50 latency": "p50_us",
    "p90 latency": "p90_us",
    "p95 latency": "p95_us",
    "p99 latency": "p99_us",
    "Avg latency": "avg_us",
    "Server Queue": "server_queue_us",
    "Server Compute Infer": "server_compute_infer_us",
}

# The GPU columns of perf_analyzer 2.51 (r24.10) with --collect-metrics --verbose-csv, and our
# names for them. Source: triton-inference-server/perf_analyzer, branch r24.10:
#   src/report_writer.cc, ReportWriter::GenerateReport: the header ends
#     ...,p50 latency,p90 latency,p95 latency,p99 latency[,Avg latency],request/response,response wait,
#     Avg GPU Utilization,Avg GPU Power Usage,Max GPU Memory Usage,Total GPU Memory
#   ("Avg latency" only without --percentile); the GPU columns only when both flags are given.
#   ReportWriter::WriteGpuMetrics: each field is "<gpu uuid>:<value>;" once per GPU (std::map, so in
#   UUID order), trailing ';' included; a field is empty when the metric was not found (a CPU host).
#   src/metrics.h: utilisation and power are doubles (written with the stream's default 6
#   significant digits), memory used/total are uint64 bytes.
#   src/client_backend/triton/triton_client_backend.cc: the values are Triton's Prometheus gauges
#   nv_gpu_utilization (a fraction, 0..1), nv_gpu_power_usage (W), nv_gpu_memory_used_bytes and
#   nv_gpu_memory_total_bytes, keyed by their gpu_uuid label ("GPU-...");
#   src/inference_profiler.cc, MergeMetrics (and docs/measurements_metrics.md): per concurrency,
#   utilisation and power are the average of all samples of the stable windows, memory used the
#   maximum, total memory the first sample.
# The real 2.51 binary writes exactly this (tests/data/README.md: recorded CSVs, 2 GPUs and a CPU host).
GPU_COLUMNS = {
    "Avg GPU Utilization": "utilization",  # fraction of time busy, 0..1 (not percent)
    "Avg GPU Power Usage": "power_w",  # watts
    "Max GPU Memory Usage": "memory_used_bytes",  # bytes
    "Total GPU Memory": "memory_total_bytes",  # bytes
}
_INTEGER_GPU_FIELDS = ("memory_used_bytes", "memory_total_bytes")
DEFAULT_METRICS_INTERVAL_MS = 1000  # perf_analyzer's own default for --metrics-interval


def rate_range(request_rate_range: str) -> tuple[float, float, float]:
    """perf_analyzer's --request-rate-range start:end:step as numbers ("N" alone is N:N:1)."""
    parts = [float(part) for part in str(request_rate_range).split(":")]
    return parts[0], (parts[1:2] or parts[:1])[0], (parts[2:3] or [1.0])[0]


def is_one_rate(request_rate_range: str) -> bool:
    """Whether a --request-rate-range holds one rate: no end, or the end is the start."""
    start, end, _ = rate_range(request_rate_range)
    return start == end


@dataclass
class PerfRun:
    """One perf_analyzer invocation against one model."""

    model: str
    url: str  # host:port of Triton's HTTP endpoint
    input_json: Path
    csv_path: Path
    concurrency_range: str = "2:12:2"  # start:end:step, as in the seed
    measurement_interval_ms: int = 5000
    stability_percentage: float = 10  # perf_analyzer takes a fraction too (0.1: windows within 0.1 %)
    max_trials: int = 10
    # "time_windows" (windows of measurement_interval_ms) or "count_windows"
    # (windows of measurement_request_count requests: robust on slow, busy machines).
    measurement_mode: str = "time_windows"
    measurement_request_count: int = 50
    # Triton's metrics endpoint ("host:8002/metrics"): when set, perf_analyzer samples the GPU
    # metrics every metrics_interval_ms and writes them to the CSV (parse_csv: row["gpus"]).
    # On a CPU host Triton serves no GPU metrics: perf_analyzer warns, measures as usual and leaves
    # the GPU columns empty. An endpoint it cannot reach fails the whole run (exit 99, "Unable to
    # connect to Metrics endpoint <url>"), so point it only at a Triton that serves metrics.
    metrics_url: str | None = None
    metrics_interval_ms: int = DEFAULT_METRICS_INTERVAL_MS
    extra_args: list[str] = field(default_factory=list)
    # The server scenario: Poisson arrivals, and perf_analyzer's own binary search (--binary-search)
    # for the highest rate of request_rate_range whose p99 stays within latency_threshold_ms; its
    # windows and stability are the profile's, as for concurrency. Empty: closed-loop concurrency.
    # A range of one rate ("8", "8:8:1") is measured once, without the search: the search measures
    # both ends of its range, the same rate twice. The threshold holds the same way in both.
    request_rate_range: str = ""
    latency_threshold_ms: float = 0

    def load_args(self) -> list[str]:
        """How perf_analyzer makes the load: closed-loop concurrency, or Poisson arrivals searched."""
        if not self.request_rate_range:
            return ["--concurrency-range", self.concurrency_range, "--percentile=95"]
        search = [] if is_one_rate(self.request_rate_range) else ["--binary-search"]
        return [
            "--request-rate-range", self.request_rate_range, "--request-distribution", "poisson",
            *search, "--latency-threshold", f"{self.latency_threshold_ms:g}",
            "--percentile=99",  # the threshold, and the windows' stability, on p99
        ]  # fmt: skip

    def target_args(self) -> list[str]:
        """The model, the server and the input: what every perf_analyzer run of this model sends."""
        return ["-m", self.model, "-u", self.url, "-i", "http", "--input-data", str(self.input_json)]

    def command(self, perf_analyzer: str = "perf_analyzer") -> list[str]:
        return [
            perf_analyzer,
            *self.target_args(),
            *self.load_args(),
            "--measurement-mode",
            self.measurement_mode,
            *(
                ["--measurement-request-count", str(self.measurement_request_count)]
                if self.measurement_mode == "count_windows"
                else ["--measurement-interval", str(self.measurement_interval_ms)]
            ),
            "--stability-percentage",
            f"{self.stability_percentage:g}",
            "--max-trials",
            str(self.max_trials),
            "-f",
            str(self.csv_path),
            *self.metrics_args(),
            *self.extra_args,
        ]

    def warmup_args(self) -> list[str]:
        """perf_analyzer's arguments (after the program) for a few requests to the model before it is measured:
        its first requests after a (re)load are slow (the Python backend's stub warms up), and in the server
        scenario a slow first window at the lowest rate ends the search. Nothing of it is kept."""
        return [
            *self.target_args(), "--concurrency-range", "1", "--measurement-mode", "count_windows",
            "--measurement-request-count", "3", "--max-trials", "1", "--stability-percentage", "999",
        ]  # fmt: skip

    def metrics_args(self) -> list[str]:
        """The GPU metrics flags, or none; perf_analyzer writes the metrics to the CSV only with --verbose-csv."""
        if not self.metrics_url:
            return []
        return [
            "--collect-metrics",
            "--metrics-url",
            self.metrics_url,
            "--metrics-interval",
            str(self.metrics_interval_ms),
            "--verbose-csv",
        ]

    def run(self, perf_analyzer: str, env: dict, timeout_s: float = 600) -> subprocess.CompletedProcess:
        """Run it; raise RuntimeError with its output when it fails."""
        result = subprocess.run(self.command(perf_analyzer), env=env, capture_output=True, text=True, timeout=timeout_s)
        if result.returncode != 0 or not self.csv_path.exists():
            raise RuntimeError(
                f"perf_analyzer failed for {self.model} (exit {result.returncode}):\n"
                f"{(result.stdout + result.stderr).strip()[-3000:]}"
            )
        return result


# Where a request's time goes, as perf_analyzer splits its average latency (microseconds), and our
# names for the parts, in the order a request meets them. perf_analyzer 2.51 writes no "Avg latency"
# column: the average is the sum of its parts ("Network+Server Send/Recv" is what the server adds
# beyond its own queue and compute: the wire and Triton's HTTP handling).
LATENCY_SPLIT = {
    "Client Send": "client_send",
    "Network+Server Send/Recv": "network_and_server_send_recv",
    "Server Queue": "server_queue",
    "Server Compute Input": "server_compute_input",
    "Server Compute Infer": "server_compute_infer",
    "Server Compute Output": "server_compute_output",
    "Client Recv": "client_recv",
}
_LATENCY_PARTS = tuple(LATENCY_SPLIT)




def parse_gpu_field(text: str | None) -> dict[str, float]:
    """One GPU column's field, "GPU-a:0.73;GPU-b:0.5;" -> {"GPU-a": 0.73, "GPU-b": 0.5}; "" -> {}."""
    values = {}
    for pair in (text or "").split(";"):
        pair = pair.strip()
        if not pair:
            continue
        uuid, colon, value = pair.rpartition(":")
        if not colon or not uuid:
            raise ValueError(f"not a <gpu uuid>:<value> pair: {pair!r} (in {text!r})")
        values[uuid] = float(value)
    return values


def _gpus(raw: dict) -> dict[str, dict]:
    """The GPU columns of one CSV row -> {uuid: {"utilization": .., "power_w": .., ...}}; {} without them."""
    gpus: dict[str, dict] = {}
    for column, name in GPU_COLUMNS.items():
        for uuid, value in parse_gpu_field(raw.get(column)).items():
            gpus.setdefault(uuid, {})[name] = int(value) if name in _INTEGER_GPU_FIELDS else value
    return dict(sorted(gpus.items()))




def parse_csv(path: Path) -> list[dict]:
    """perf_analyzer's CSV -> [{"concurrency": 2, "throughput": 51.2, "p50_us": ...}], by concurrency.

    "split_us": {part: microseconds} is where the average latency went (LATENCY_SPLIT's parts).

    With GPU metrics (PerfRun.metrics_url) a row also has "gpus": {uuid: {"utilization": fraction
    0..1, "power_w": watts, "memory_used_bytes": peak bytes, "memory_total_bytes": bytes}}; a
    GPU lacks a key whose metric Triton did not report. Rows without GPU metrics (no such
    columns, or empty ones on a CPU host) have no "gpus" key.
    """
    rows = []
    with open(path, newline="") as file:
        for raw in csv.DictReader(file):
            row = {}
            for column, name in _COLUMNS.items():
                if column in raw and raw[column] not in ("", None):
                    value = float(raw[column])
                    row[name] = int(value) if name == "concurrency" else value
            if all(raw.get(part) not in ("", None) for part in _LATENCY_PARTS):
                row["split_us"] = {name: float(raw[part]) for part, name in LATENCY_SPLIT.items()}
                row.setdefault("avg_us", sum(row["split_us"].values()))
            gpus = _gpus(raw)
            if gpus:
                row["gpus"] = gpus
            if ("concurrency" in row or "request_rate" in row) and "throughput" in row:
                rows.append(row)
    if not rows:
        raise ValueError(f"{path} has no perf_analyzer measurements")
    return sorted(rows, key=lambda row: row.get("concurrency", row.get("request_rate")))


# --------------------------------------------------------------------------- Triton's own statistics

# The parts of a request's time Triton counts itself (/v2/models/<m>/stats "inference_stats": a
# count and a total in nanoseconds each), in the order a request meets them, in the report's words.
TRITON_DURATIONS = {
    "queue": "queue",
    "compute_input": "compute input",
    "compute_infer": "compute infer",
    "compute_output": "compute output",
}


def model_statistics(url: str, model: str, timeout_s: float = 30) -> dict:
    """Triton's statistics of one model (GET /v2/models/<model>/stats): its every version's counts and times
    since it was loaded. `url`: host:port of Triton's HTTP endpoint, as perf_analyzer takes it."""
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=timeout_s) as response:
        document = json.loads(response.read())
    return next((entry for entry in document.get("model_stats", []) if entry.get("name") == model), {})


def _counts(statistics: dict) -> dict:
    """The counters of one model's statistics: requests, executions, the time of each part (ns), batches."""
    inference = statistics.get("inference_stats", {})
    return {
        "requests": int(inference.get("success", {}).get("count", 0)),
        "failed": int(inference.get("fail", {}).get("count", 0)),
        "inferences": int(statistics.get("inference_count", 0)),
        "executions": int(statistics.get("execution_count", 0)),
        **{f"{part}_ns": int(inference.get(part, {}).get("ns", 0)) for part in TRITON_DURATIONS},
        "batches": {int(batch["batch_size"]): int(batch["compute_infer"]["count"]) for batch in statistics.get("batch_stats", [])},
    }


def statistics_delta(before: dict, after: dict) -> dict:
    """What Triton counted between two model_statistics() of one model: requests, failures, inferences,
    executions (so the images per execution: what dynamic batching made of the requests), the
    average time of each part per request (microseconds), the executions of each batch size."""
    first, last = _counts(before), _counts(after)
    requests = last["requests"] - first["requests"]
    batches = {size: count - first["batches"].get(size, 0) for size, count in last["batches"].items()}
    return {
        "requests": requests,
        "failed": last["failed"] - first["failed"],
        "inferences": last["inferences"] - first["inferences"],
        "executions": last["executions"] - first["executions"],
        "average_us": {
            part: (last[f"{part}_ns"] - first[f"{part}_ns"]) / requests / 1000 if requests else 0.0
            for part in TRITON_DURATIONS
        },
        "executions_by_batch_size": {size: count for size, count in sorted(batches.items()) if count},
    }


def statistics_table(deltas: dict[str, dict]) -> list[str]:
    """A markdown table of statistics_delta() per model: what Triton itself saw of the requests."""
    lines = [
        "| model | requests | failed | executions | images per execution | "
        + " | ".join(f"{words} ms" for words in TRITON_DURATIONS.values())
        + " | executions by batch size |",
        "|---|---:|---:|---:|---:|" + "---:|" * len(TRITON_DURATIONS) + "---|",
    ]
    for model, delta in deltas.items():
        per_execution = f"{delta['inferences'] / delta['executions']:.2f}" if delta["executions"] else "-"
        parts = " | ".join(f"{delta['average_us'][part] / 1000:.2f}" for part in TRITON_DURATIONS)
        batches = ", ".join(f"{size}: {count}" for size, count in delta["executions_by_batch_size"].items()) or "-"
        lines.append(
            f"| {model} | {delta['requests']} | {delta['failed']} | {delta['executions']} | {per_execution} | {parts} | {batches} |"
        )
    return lines


# --------------------------------------------------------------------------- a profile, here


def profile(
    models: list[str], url: str, input_json: Path, folder: Path, perf_analyzer: str = "perf_analyzer",
    env: dict | None = None, **settings,
) -> dict[str, dict]:
    """Measure each model here as `fab bench` does (one PerfRun each, `settings` its profile:
    concurrency_range, measurement_mode, ...), with Triton's statistics read before and after:
    {model: {"rows": parse_csv's rows, "command": the command line, "statistics": statistics_delta,
    "error": perf_analyzer's output where it failed (then no rows)}}. The CSVs go to `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    results = {}
    for model in models:
        run = PerfRun(model=model, url=url, input_json=input_json, csv_path=folder / f"{model}.csv", **settings)
        before = model_statistics(url, model)
        try:
            run.run(perf_analyzer, env=env if env is not None else dict(os.environ))
            rows, error = parse_csv(run.csv_path), ""
        except RuntimeError as failure:  # perf_analyzer's own words: no stable window, a refused request
            rows, error = [], str(failure)
        results[model] = {
            "rows": rows,
            "error": error,
            "command": " ".join(run.command(perf_analyzer)),
            "statistics": statistics_delta(before, model_statistics(url, model)),
        }
    return results

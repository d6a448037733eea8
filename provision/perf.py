"""perf_analyzer: its input file, its command line, and its CSV.

perf_analyzer (from the tritonclient 2.51.0 wheel) measures throughput and
latency percentiles of a model at a range of concurrencies. Its `-f` CSV has
one row per concurrency, sorted by throughput (not by concurrency), times in
microseconds; `parse_csv` turns it into rows sorted by concurrency.

On GPU hosts it can also record Triton's GPU metrics per concurrency
(`PerfRun(metrics_url=...)`: --collect-metrics --verbose-csv); `parse_csv`
puts them under row["gpus"], one entry per GPU UUID.
"""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from provision.config import client_script

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


# The scenarios a bench measures (fab bench --scenario): closed-loop concurrency (each client sends its
# next request once the last is answered), or server (MLPerf Inference's: Poisson arrivals that do not
# wait, and the highest rate whose p99 stays within a bound).
SCENARIOS = ("closed_loop", "server")


def rate_range(request_rate_range: str) -> tuple[float, float, float]:
    """perf_analyzer's --request-rate-range start:end:step as numbers ("N" alone is N:N:1)."""
    parts = [float(part) for part in str(request_rate_range).split(":")]
    return parts[0], (parts[1:2] or parts[:1])[0], (parts[2:3] or [1.0])[0]


def rate_search_steps(request_rate_range: str) -> int:
    """How many rates perf_analyzer's binary search measures at most over start:end:step: both ends,
    then halving the interval until it is narrower than the step."""
    start, end, step = rate_range(request_rate_range)
    return 2 + max(0, math.ceil(math.log2(max((end - start) / max(step, 1e-9), 1.0))))


def rates_tried(log_text: str) -> list[float]:
    """The request rates perf_analyzer measured, in the order it tried them (its log says each)."""
    return [float(found) for found in re.findall(r"^Request Rate: ([0-9.]+) inference requests per second", log_text, re.M)]


def sustained(rows: list[dict], p99_ms: float) -> dict | None:
    """The row of the highest offered rate whose p99 is within the bound; None where none is."""
    within = [row for row in rows if "request_rate" in row and row["p99_us"] <= p99_ms * 1000]
    return max(within, key=lambda row: row["request_rate"], default=None)


def concurrency_levels(concurrency_range: str) -> list[int]:
    """perf_analyzer's start:end:step as the list of levels it measures."""
    parts = [int(part) for part in str(concurrency_range).split(":")]
    start, end, step = parts[0], (parts[1:2] or parts[:1])[0], (parts[2:3] or [1])[0]  # "N" alone is N:N:1
    return list(range(start, end + 1, step))


def _make_perf_input():
    """client_scripts/make_perf_input.py, the one writer of perf_analyzer's input (it runs on the hosts too)."""
    return client_script("make_perf_input")


def input_encodings() -> tuple[str, ...]:
    """How perf_analyzer can send the image: "raw" (the file's bytes) or "base64"."""
    return _make_perf_input().ENCODINGS


def write_input_json(path: Path, images: list[bytes], input_name: str = "INPUT_IMAGE", encoding: str = "raw") -> Path:
    """The --input-data file for these image files' contents, sent as their bytes (raw) or base64."""
    path.write_text(json.dumps(_make_perf_input().perf_input(images, input_name, encoding)))
    return path


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
    request_rate_range: str = ""
    latency_threshold_ms: float = 0

    def load_args(self) -> list[str]:
        """How perf_analyzer makes the load: closed-loop concurrency, or Poisson arrivals searched."""
        if not self.request_rate_range:
            return ["--concurrency-range", self.concurrency_range, "--percentile=95"]
        return [
            "--request-rate-range", self.request_rate_range, "--request-distribution", "poisson",
            "--binary-search", "--latency-threshold", f"{self.latency_threshold_ms:g}",
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


# What perf_analyzer says when it gives up on a level (it then measures no higher one).
UNSTABLE = "Failed to obtain stable measurement"


def measurement_stamp(measurement: str, csv_name: str) -> str:
    """The line bench.yml's measurement prints when perf_analyzer wrote `csv_name` in that measurement."""
    return f"measurement {measurement} wrote {csv_name}"


def fresh_csv(csv_path: Path, log_path: Path, measurement: str) -> Path | None:
    """The CSV fetched for one measurement, if that measurement wrote it; None otherwise.

    The host removes the CSV before perf_analyzer runs and its log's last line
    says when perf_analyzer wrote one, so a CSV without that line in the log
    comes from somewhere else (an earlier measurement): it is removed, never reported.
    """
    if not csv_path.exists():
        return None
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    if measurement_stamp(measurement, csv_path.name) not in log:
        csv_path.unlink()
        return None
    return csv_path


# The line bench.yml's measurement prints after perf_analyzer ends: the host's 1-minute load average then
# (the load the measurement ran under, its own included) and the host's cores. A load above the cores
# means processes waited for a CPU: the figures may be low (run_folder.busy says which were).
HOST_LOAD = re.compile(r"host load: 1-minute load average ([0-9.]+) on ([0-9]+) cores")


def host_load(log_text: str) -> dict | None:
    """{"load_average", "cores"} from a measurement's log (its last such line), or None: not recorded."""
    found = HOST_LOAD.findall(log_text)
    if not found:
        return None
    load, cores = found[-1]
    return {"load_average": float(load), "cores": int(cores)}


# What perf_analyzer says, and then stops, where the server scenario's first rate is already over the bound
# (--latency-threshold): no CSV is written, and the answer is "no rate within the bound".
OVER_THE_LIMIT = "Measured latency went over the set limit"


def over_the_limit(log_text: str) -> bool:
    return OVER_THE_LIMIT in log_text


def unstable_reason(log_text: str) -> str | None:
    """perf_analyzer's own words where it found no stable measurement (the last time it said so), or None."""
    lines = [line.strip() for line in log_text.splitlines() if UNSTABLE in line]
    # "... within 3 measurement windows for concurrency 2. Please try to increase ..." says more
    # than the "Failed to obtain stable measurement." that ends the run.
    detailed = [line for line in lines if "within" in line]
    return (detailed or lines or [None])[-1]


def metrics_url(host: str, port: int = 8002) -> str:
    """Triton's metrics endpoint in the form --metrics-url takes."""
    return f"{host}:{port}/metrics"


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

"""perf_analyzer: its input file, its command line, and its CSV.

perf_analyzer (from the tritonclient 2.51.0 wheel) measures throughput and
latency percentiles of a model at a range of concurrencies. Its `-f` CSV has
one row per concurrency, sorted by throughput (not by concurrency), times in
microseconds; `parse_csv` turns it into rows sorted by concurrency.
"""

from __future__ import annotations

import csv
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

# CSV header -> our field name.
_COLUMNS = {
    "Concurrency": "concurrency",
    "Inferences/Second": "throughput",
    "p50 latency": "p50_us",
    "p90 latency": "p90_us",
    "p95 latency": "p95_us",
    "p99 latency": "p99_us",
    "Avg latency": "avg_us",
    "Server Queue": "server_queue_us",
    "Server Compute Infer": "server_compute_infer_us",
}


def write_input_json(path: Path, images_b64: list[bytes], input_name: str = "INPUT_IMAGE") -> Path:
    """The --input-data file: one entry per image, each a one-element BYTES tensor."""
    data = {"data": [{input_name: [image.decode("ascii")]} for image in images_b64]}
    path.write_text(json.dumps(data))
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
    stability_percentage: int = 10
    max_trials: int = 10
    # "time_windows" (windows of measurement_interval_ms) or "count_windows"
    # (windows of measurement_request_count requests: robust on slow, busy machines).
    measurement_mode: str = "time_windows"
    measurement_request_count: int = 50
    extra_args: list[str] = field(default_factory=list)

    def command(self, perf_analyzer: str = "perf_analyzer") -> list[str]:
        return [
            perf_analyzer,
            "-m",
            self.model,
            "-u",
            self.url,
            "-i",
            "http",
            "--concurrency-range",
            self.concurrency_range,
            "--input-data",
            str(self.input_json),
            "--measurement-mode",
            self.measurement_mode,
            *(
                ["--measurement-request-count", str(self.measurement_request_count)]
                if self.measurement_mode == "count_windows"
                else ["--measurement-interval", str(self.measurement_interval_ms)]
            ),
            "--stability-percentage",
            str(self.stability_percentage),
            "--max-trials",
            str(self.max_trials),
            "--percentile=95",
            "-f",
            str(self.csv_path),
            *self.extra_args,
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


# perf_analyzer 2.51 writes no "Avg latency" column: the average is the sum of its parts.
_LATENCY_PARTS = (
    "Client Send",
    "Network+Server Send/Recv",
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
    "Client Recv",
)


def parse_csv(path: Path) -> list[dict]:
    """perf_analyzer's CSV -> [{"concurrency": 2, "throughput": 51.2, "p50_us": ...}], by concurrency."""
    rows = []
    with open(path, newline="") as file:
        for raw in csv.DictReader(file):
            row = {}
            for column, name in _COLUMNS.items():
                if column in raw and raw[column] not in ("", None):
                    value = float(raw[column])
                    row[name] = int(value) if name == "concurrency" else value
            if "avg_us" not in row and all(raw.get(part) not in ("", None) for part in _LATENCY_PARTS):
                row["avg_us"] = sum(float(raw[part]) for part in _LATENCY_PARTS)
            if "concurrency" in row and "throughput" in row:
                rows.append(row)
    if not rows:
        raise ValueError(f"{path} has no perf_analyzer measurements")
    return sorted(rows, key=lambda row: row["concurrency"])

"""perf_analyzer on the controller's side: its input file, its scenarios and levels, what its logs say.

perf_analyzer's command line (PerfRun) and its CSV (parse_csv, LATENCY_SPLIT, GPU_COLUMNS,
parse_gpu_field) are client_scripts/perf_run.py's, since the profiling notebook runs them on the
hosts too; this module hands them out as its own (`from provision.perf import PerfRun`), loading
that script when one is first asked for (an installed wheel has no client_scripts: importing this
module must not need them).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from provision.config import client_script

# What client_scripts/perf_run.py gives this module (__getattr__ below).
FROM_PERF_RUN = ("PerfRun", "parse_csv", "parse_gpu_field", "LATENCY_SPLIT", "GPU_COLUMNS", "DEFAULT_METRICS_INTERVAL_MS")


def __getattr__(name: str):
    """PerfRun, parse_csv, ...: client_scripts/perf_run.py's, loaded when first asked for (PEP 562)."""
    if name in FROM_PERF_RUN:
        return getattr(client_script("perf_run"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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

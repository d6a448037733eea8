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
FROM_PERF_RUN = (
    "PerfRun", "parse_csv", "parse_gpu_field", "LATENCY_SPLIT", "GPU_COLUMNS", "DEFAULT_METRICS_INTERVAL_MS",
    "rate_range", "is_one_rate",
)  # fmt: skip


def __getattr__(name: str):
    """PerfRun, parse_csv, ...: client_scripts/perf_run.py's, loaded when first asked for (PEP 562)."""
    if name in FROM_PERF_RUN:
        return getattr(client_script("perf_run"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The scenarios a bench measures (fab bench --scenario): closed-loop concurrency (each client sends its
# next request once the last is answered), or server (MLPerf Inference's: Poisson arrivals that do not
# wait, and the highest rate whose p99 stays within a bound).
SCENARIOS = ("closed_loop", "server")


def rate_search_steps(request_rate_range: str) -> int:
    """How many rates perf_analyzer measures at most over start:end:step: one where the range holds
    one rate (measured without the search); else both ends, then halving the interval until it is
    narrower than the step (its binary search)."""
    perf_run = client_script("perf_run")
    if perf_run.is_one_rate(request_rate_range):
        return 1
    start, end, step = perf_run.rate_range(request_rate_range)
    return 2 + max(0, math.ceil(math.log2(max((end - start) / max(step, 1e-9), 1.0))))


def csv_rate(rate: float | str) -> float:
    """A request rate as perf_analyzer's CSV gives it (two decimals): its log says 40.375 or 47.2656
    where the binary search halved an interval, its CSV 40.38 and 47.27. Rates from both meet here."""
    return round(float(rate), 2)


def rates_tried(log_text: str) -> list[float]:
    """The request rates perf_analyzer measured, in the order it tried them (its log says each), as its CSV has them."""
    return [csv_rate(found) for found in re.findall(r"^Request Rate: ([0-9.]+) inference requests per second", log_text, re.M)]


# When a Poisson rate counts as sustained (MLPerf's Server scenario counts a rate only when the load
# generator issued the queries on schedule and the bound held): perf_analyzer sent fewer than this share
# of its requests late, and where it says what it sent, it got at least this fraction of it answered.
DELAYED_LIMIT_PERCENT = 2.0
ANSWERED_FRACTION = 0.9
# perf_analyzer (2.51) draws its Poisson schedule from a random generator it never seeds: every run sends
# the same arrivals, and their first ones come slow (12 requests take 26 mean intervals: 0.46 of the
# rate asked; 100 take 120: 0.84). About this many requests bring the rate it sends within 10 % of the
# rate asked. A rate is therefore quoted as what was sent and answered, not as what was asked.
SCHEDULE_REQUESTS = 200

_RATE_HEADER = re.compile(r"^Request Rate: ([0-9.]+) inference requests per second", re.M)
_SEND_RATE = re.compile(r"Avg send request rate: ([0-9.]+) infer/sec")
_REQUEST_COUNT = re.compile(r"Client:\s*\n\s*Request count: ([0-9]+)")
_DELAYED = re.compile(r"not able to keep up with the desired request rate\. ([0-9.]+)% of the requests were delayed")


def rate_facts(log_text: str) -> dict[float, dict]:
    """What perf_analyzer's log says of each rate it measured: {rate: {"send_rate": the rate it really
    sent (None: it printed none, since no request was late), "delayed_percent": the share it sent late,
    "request_count": the requests its windows measured (None: not logged)}}."""
    headers = list(_RATE_HEADER.finditer(log_text))
    facts = {}
    for number, header in enumerate(headers):
        end = headers[number + 1].start() if number + 1 < len(headers) else len(log_text)
        block = log_text[header.end() : end]
        send_rate, delayed, count = _SEND_RATE.search(block), _DELAYED.search(block), _REQUEST_COUNT.search(block)
        facts[csv_rate(header.group(1))] = {
            "send_rate": float(send_rate.group(1)) if send_rate else None,
            "delayed_percent": float(delayed.group(1)) if delayed else 0.0,
            "request_count": int(count.group(1)) if count else None,
        }
    return facts


def with_rate_facts(rows: list[dict], log_text: str) -> list[dict]:
    """The server scenario's rows with what the log says of their rate (rate_facts); other rows as they are."""
    facts = rate_facts(log_text)
    return [
        {**row, **facts.get(csv_rate(row["request_rate"]), {"send_rate": None, "delayed_percent": 0.0, "request_count": None})}
        if "request_rate" in row
        else row
        for row in rows
    ]


def shortfall(row: dict, p99_ms: float) -> str | None:
    """Why a server-scenario row's rate is not sustained, in words; None where it is: p99 within the bound,
    sent on schedule (fewer than DELAYED_LIMIT_PERCENT of the requests late) and answered (at least
    ANSWERED_FRACTION of what perf_analyzer says it sent, where it says)."""
    reasons = []
    if row["p99_us"] > p99_ms * 1000:
        reasons.append(f"p99 {row['p99_us'] / 1000:.1f} ms is over the bound")
    delayed = row.get("delayed_percent", 0.0)
    send_rate = row.get("send_rate")
    if delayed >= DELAYED_LIMIT_PERCENT:
        sent = f" ({send_rate:g} requests/s sent of {row['request_rate']:g} asked)" if send_rate is not None else ""
        queue_ms = row.get("split_us", {}).get("server_queue", 0) / 1000
        limit = (
            f"the server fell behind (requests waited {queue_ms:.1f} ms in its queue)"
            if queue_ms * 2 > row.get("avg_us", 0) / 1000
            else f"the client on this machine could not keep up (the server's queue held requests {queue_ms:.1f} ms)"
        )
        reasons.append(f"perf_analyzer sent {delayed:g} % of the requests late{sent}: {limit}")
    if send_rate is not None and row["throughput"] < ANSWERED_FRACTION * send_rate:
        reasons.append(f"{row['throughput']:.2f} infer/s answered of {send_rate:g} requests/s sent: the server fell behind")
    return "; ".join(reasons) or None


def schedule_shortfall(row: dict) -> str | None:
    """Where perf_analyzer sent fewer than asked with no request late (its schedule's slow start), in words."""
    if row.get("delayed_percent", 0.0) >= DELAYED_LIMIT_PERCENT or row["throughput"] >= ANSWERED_FRACTION * row["request_rate"]:
        return None
    counted = f"{row['request_count']} " if row.get("request_count") else ""
    return (
        f"perf_analyzer asked for {row['request_rate']:g} requests/s and sent {row['throughput']:.2f}, none late: its "
        f"Poisson schedule is the same every run and starts slow, so over these {counted}requests it carried "
        f"{row['throughput'] / row['request_rate']:.0%} of the rate (about {SCHEDULE_REQUESTS} requests bring it within 10 %)"
    )


def sustained(rows: list[dict], p99_ms: float) -> dict | None:
    """The row of the highest rate sent and answered (its throughput) among those sustained (shortfall()
    is None); None where none was."""
    kept = [row for row in rows if "request_rate" in row and shortfall(row, p99_ms) is None]
    return max(kept, key=lambda row: row["throughput"], default=None)


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


# perf_analyzer answers a bad argument with one "Error: ..." line, then its usage: some 300 lines.
_USAGE = re.compile(r"^Usage: \S*perf_analyzer \[options\]", re.M)


def without_usage(text: str) -> str:
    """perf_analyzer's output with its usage text cut off (its own error line is what says what is wrong)."""
    found = _USAGE.search(text)
    return text[: found.start()].rstrip() + "\n(perf_analyzer's usage text left out)" if found else text


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

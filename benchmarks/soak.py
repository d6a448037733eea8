"""Hours of load without a leak: perf_analyzer and the API's /classify against one deployment, side by side.

    .venv/bin/python benchmarks/soak.py [--minutes 10] [--concurrency 16] [--api-clients 4] [--runtime docker]

Deploys on the local target as an isolated user (own state file, deploy folder
and free ports, as benchmarks/deploy_time.py does), then for the given time
runs, at once:
  - perf_analyzer on batching_food_classifier at --concurrency, three 15 s windows a minute;
  - a pool of --api-clients threads posting a JPEG to the API's /classify.
Every minute it prints the requests and errors of both, their throughput, and
the resident memory (RSS) of tritonserver, every Python backend stub (by
model) and the API. It tears down at the end and exits 1 when any request
failed or a process grew more than --max-growth-mb between the end of the
warm-up minute and the end of the run.

--runtime docker soaks the docker runtime with the tests' engine and bases
(provision/docker_engine.py, `make docker-bases`): the containers' processes are
processes of this machine, so their RSS is read the same way.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from deploy_time import BASELINE_RUNTIME, PORTS, fab, host_helper, runtime_env  # noqa: E402

from provision import config, perf, runtimes, sample_images  # noqa: E402
from provision.host.background import free_ports  # noqa: E402
from provision.host.tritonserver import perf_analyzer_env  # noqa: E402

MODEL = "batching_food_classifier"
STUB = "triton_python_backend_stub"
WINDOW_MS = 15_000  # perf_analyzer's measurement window; three of them per minute


# ---------------------------------------------------------------- the processes and their memory


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:  # fields[1]: the parent's pid
            found.append(int(stat.parent.name))
    return found


def descendants(pid: int) -> list[int]:
    below = children(pid)
    return below + [grandchild for child in below for grandchild in descendants(child)]


def command_line(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except FileNotFoundError:
        return []


def main_pids(env: dict) -> tuple[int, int]:
    """(tritonserver's pid, the API server's pid) on this machine, as the runtime's host helper says."""
    pids = json.loads(host_helper(env, "pids"))
    return pids["triton"], pids["api"]


def memory(triton_pid: int, api_pid: int) -> dict[str, float]:
    """{process label: RSS MB}: tritonserver, each stub ("stub food_classifier #1"), the API."""
    sample = {"tritonserver": rss_mb(triton_pid), "api": rss_mb(api_pid)}
    counts: dict[str, int] = {}
    for pid in sorted(descendants(triton_pid)):
        words = command_line(pid)
        if not words or not words[0].endswith(STUB):
            continue
        model = next((Path(w).parent.parent.name for w in words if w.endswith("model.py")), "?")
        counts[model] = counts.get(model, 0) + 1
        sample[f"stub {model} #{counts[model]}"] = rss_mb(pid)
    return {label: value for label, value in sample.items() if value is not None}


# ---------------------------------------------------------------- the two loads


@dataclass
class Tally:
    """Requests and errors per minute, filled by the load threads."""

    requests: dict[int, int] = field(default_factory=dict)
    errors: dict[int, int] = field(default_factory=dict)
    first_errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, minute: int, requests: int, errors: int = 0, error: str = "") -> None:
        with self.lock:
            self.requests[minute] = self.requests.get(minute, 0) + requests
            self.errors[minute] = self.errors.get(minute, 0) + errors
            if error and len(self.first_errors) < 5:
                self.first_errors.append(error)


def api_clients(url: str, clients: int, started: float, stop: threading.Event, tally: Tally) -> list[threading.Thread]:
    image = sample_images.jpeg(seed=21)

    def client() -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            while not stop.is_set():
                minute = int((time.monotonic() - started) // 60)
                try:
                    answer = http.post("/classify", files={"file": ("food.jpg", image, "image/jpeg")})
                    ok = answer.status_code == 200 and answer.json().get("label")
                    tally.add(minute, 1, 0 if ok else 1, "" if ok else f"{answer.status_code} {answer.text[:200]}")
                except httpx.HTTPError as failed:
                    tally.add(minute, 1, 1, repr(failed))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    return threads


def perf_window(triton: str, concurrency: int, folder: Path, minute: int, env: dict, tally: Tally) -> float:
    """One minute of perf_analyzer at a fixed concurrency; returns its throughput (infer/s)."""
    csv_path = folder / f"minute-{minute}.csv"
    run = perf.PerfRun(
        model=MODEL, url=triton, input_json=folder / "input.json", csv_path=csv_path,
        # Three 15 s windows, accepted whatever their stability (perf_analyzer judges stability
        # over its last three windows): a soak counts requests and errors, it does not search.
        concurrency_range=f"{concurrency}:{concurrency}:1", measurement_interval_ms=WINDOW_MS,
        stability_percentage=999, max_trials=3,
    )  # fmt: skip
    done = subprocess.run(run.command(str(Path(sys.executable).parent / "perf_analyzer")), env=env,
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    if done.returncode != 0 or not csv_path.exists():
        tally.add(minute, 0, 1, f"perf_analyzer exit {done.returncode}: {(done.stdout + done.stderr)[-400:]}")
        return 0.0
    with csv_path.open() as rows:
        row = next(csv.DictReader(rows))
    throughput = float(row["Inferences/Second"])
    tally.add(minute, round(throughput * 3 * WINDOW_MS / 1000))
    return throughput


# ---------------------------------------------------------------- the run


def soak(args: argparse.Namespace, env: dict, deploy_dir: Path, folder: Path) -> int:
    ports = {name: int(env[f"FABRIC_LAB_PORTS_{name.upper()}"]) for name in PORTS}
    triton = f"127.0.0.1:{ports['triton_http']}"
    perf.write_input_json(folder / "input.json", [sample_images.jpeg(seed=22)])
    perf_env = perf_analyzer_env(config.runtime_dir() / "triton")
    triton_pid, api_pid = main_pids(env)

    perf_tally, api_tally, stop = Tally(), Tally(), threading.Event()
    started = time.monotonic()
    threads = api_clients(f"http://127.0.0.1:{ports['api']}", args.api_clients, started, stop, api_tally)
    samples, throughputs = [], []
    print(f"soak: {args.minutes} min, perf_analyzer on {MODEL} at concurrency {args.concurrency}, "
          f"{args.api_clients} API clients on /classify ({args.runtime} runtime)", flush=True)  # fmt: skip
    for minute in range(args.minutes):
        throughputs.append(perf_window(triton, args.concurrency, folder, minute, perf_env, perf_tally))
        while time.monotonic() - started < (minute + 1) * 60:
            time.sleep(0.5)
        samples.append(memory(triton_pid, api_pid))
        print(f"  minute {minute + 1}: perf {perf_tally.requests.get(minute, 0)} requests "
              f"({throughputs[-1]:.1f}/s), API {api_tally.requests.get(minute, 0)} requests, "
              f"errors {perf_tally.errors.get(minute, 0) + api_tally.errors.get(minute, 0)}", flush=True)  # fmt: skip
    stop.set()
    for thread in threads:
        thread.join(timeout=90)

    print(f"\n{'minute':>6} {'perf req':>9} {'perf/s':>7} {'API req':>8} {'API/s':>6} {'errors':>6}")
    for minute in range(args.minutes):
        errors = perf_tally.errors.get(minute, 0) + api_tally.errors.get(minute, 0)
        api = api_tally.requests.get(minute, 0)
        print(f"{minute + 1:>6} {perf_tally.requests.get(minute, 0):>9} {throughputs[minute]:>7.1f} "
              f"{api:>8} {api / 60:>6.1f} {errors:>6}")  # fmt: skip

    labels = sorted({label for sample in samples for label in sample}, key=lambda s: (not s.startswith("triton"), s))
    warm = min(args.warmup_minutes, len(samples)) - 1
    print(f"\nRSS MB at the end of each minute (growth: last minus minute {warm + 1}, the end of the warm-up)")
    print(f"{'process':<34}" + "".join(f"{m + 1:>7}" for m in range(len(samples))) + f"{'growth':>8}")
    grown = []
    for label in labels:
        values = [sample.get(label) for sample in samples]
        growth = (values[-1] - values[warm]) if values[-1] is not None and values[warm] is not None else None
        if growth is not None and growth > args.max_growth_mb:
            grown.append(f"{label} +{growth:.0f} MB")
        cells = "".join(f"{v:>7.0f}" if v is not None else f"{'-':>7}" for v in values)
        print(f"{label:<34}{cells}{(f'{growth:+8.1f}' if growth is not None else '       -')}")

    errors = sum(perf_tally.errors.values()) + sum(api_tally.errors.values())
    requests = sum(perf_tally.requests.values()) + sum(api_tally.requests.values())
    print(f"\ntotal: {requests} requests, {errors} errors; bound: {args.max_growth_mb} MB of growth per process")
    for error in perf_tally.first_errors + api_tally.first_errors:
        print(f"  error: {error}")
    if errors or grown:
        print("FAIL: " + "; ".join(([f"{errors} errors"] if errors else []) + grown))
        return 1
    print("PASS: no errors, no process grew beyond the bound")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=16, help="perf_analyzer's concurrency (default 16)")
    parser.add_argument("--api-clients", type=int, default=4, help="threads posting to /classify (default 4)")
    parser.add_argument("--warmup-minutes", type=int, default=1, help="growth is measured from the end of these")
    parser.add_argument(
        "--max-growth-mb", type=float, default=64.0, help="RSS growth allowed per process after warm-up"
    )
    parser.add_argument("--runtime", choices=runtimes.RUNTIMES, default=BASELINE_RUNTIME)
    args = parser.parse_args()
    if args.minutes <= args.warmup_minutes:
        sys.exit("--minutes must be more than --warmup-minutes")
    with tempfile.TemporaryDirectory(prefix="soak-") as folder:
        env = dict(os.environ, LAB_STATE_FILE=f"{folder}/state/state.json",
                   FABRIC_LAB_LOCAL_DEPLOY_DIR=f"{folder}/deploy")  # fmt: skip
        env.update({f"FABRIC_LAB_PORTS_{name.upper()}": str(port) for name, port in zip(PORTS, free_ports(len(PORTS)))})
        env = runtime_env(args.runtime, env)
        fab(env, "provision", "--target", "local", "--runtime", args.runtime)
        try:
            fab(env, "deploy")
            (Path(folder) / "perf").mkdir()
            verdict = soak(args, env, Path(folder) / "deploy", Path(folder) / "perf")
        finally:
            fab(env, "teardown")
    print(f"load average after: {os.getloadavg()[0]:.2f} (2 cores here)")
    sys.exit(verdict)


if __name__ == "__main__":
    main()

"""Two servers sharing the CPU: the OpenMP wait policy of the model stubs, side by side.

    .venv/bin/python benchmarks/shared_cores.py [--model food_classifier] [--repeat 2]

Four tritonservers serve the same model (smoke weights): two whose stubs'
OpenMP threads spin while they wait for work (libgomp's default spin count,
what torch did before the model code asked for passive waiting), two whose
threads sleep (OMP_WAIT_POLICY=PASSIVE, the model code's default). For each
policy, perf_analyzer measures one of its servers alone, then both of its
servers at once (the same concurrency levels), as a host does whose cores are
shared: the ensemble's two models, perf_analyzer itself, a second deployment
or a test worker. Prints throughput and p50 latency per level, and the ratio of
"both at once" to "alone" for each policy: with enough cores each server keeps
its figure (ratio 1); two servers that share the cores fairly keep half (0.5).
Where the ratio falls far below 0.5, the cores go to threads that wait.

The machine is noisy: compare within one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from provision import config, sample_images, smoke_weights  # noqa: E402
from provision.host.tritonserver import TritonProcess, TritonRuntime, perf_analyzer_env  # noqa: E402
from provision.model_repo import RenderValues, render  # noqa: E402
from provision.perf import write_input_json  # noqa: E402

# The stub's environment comes from the server's. An explicit OMP_WAIT_POLICY
# wins over the model code's default (os.environ.setdefault).
POLICIES = {
    "spin": {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"},  # = libgomp's default when unset
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
}
LEVELS = "2:4:2"


def start_server(work: Path, name: str, values: RenderValues, model: str, policy: dict) -> TritonProcess:
    rendered = work / f"rendered-{name}"
    render(rendered, values)
    repository = work / f"repository-{name}"
    repository.mkdir()
    shutil.copytree(rendered / model, repository / model)
    server = TritonProcess.on_free_ports(TritonRuntime(config.runtime_dir() / "triton").root, repository, work / name)
    saved = dict(os.environ)
    os.environ.update(policy)  # TritonProcess passes this process's environment on
    try:
        server.start([model], timeout_s=300)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return server


def measure(server: TritonProcess, model: str, input_json: Path) -> list[tuple[int, float, float]]:
    """[(concurrency, infer/s, p50 ms)] from perf_analyzer's windows of 12 requests."""
    csv = input_json.parent / f"{server.http_port}.csv"
    argv = [
        str(Path(sys.executable).parent / "perf_analyzer"), "-m", model, "-u", f"127.0.0.1:{server.http_port}",
        "--input-data", str(input_json), "--concurrency-range", LEVELS, "--measurement-mode", "count_windows",
        "--measurement-request-count", "12", "--stability-percentage", "999", "--max-trials", "10", "-f", str(csv),
    ]  # fmt: skip
    runtime = TritonRuntime(config.runtime_dir() / "triton")
    done = subprocess.run(argv, env=perf_analyzer_env(runtime.root), capture_output=True, text=True)
    if done.returncode != 0:
        return []
    header, *rows = [line.split(",") for line in csv.read_text().splitlines()]
    column = {name: index for index, name in enumerate(header)}
    return sorted(
        (
            int(row[column["Concurrency"]]),
            float(row[column["Inferences/Second"]]),
            int(row[column["p50 latency"]]) / 1000,
        )
        for row in rows
    )


def at_once(servers: list[TritonProcess], model: str, input_json: Path) -> list[list[tuple[int, float, float]]]:
    results: list = [None] * len(servers)

    def run(index: int) -> None:
        results[index] = measure(servers[index], model, input_json)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(servers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="food_classifier")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="shared-cores-") as folder:
        work = Path(folder)
        smoke_weights.generate(work / "weights")
        values = RenderValues(
            gpu_count=0,
            food11_weights_path=str(work / "weights" / smoke_weights.FOOD11_FILE),
            blip_source=str(work / "weights" / smoke_weights.BLIP_FOLDER),
            reduced_decoding=True,  # as deployed (the default)
        )
        input_json = write_input_json(work / "input.json", [sample_images.jpeg(seed=4)])
        servers = {
            policy: [start_server(work, f"{policy}-{n}", values, args.model, env) for n in (1, 2)]
            for policy, env in POLICIES.items()
        }
        try:
            for pair in servers.values():  # the stubs' slow first requests, outside the measurements
                at_once(pair, args.model, input_json)
            print(f"{args.model}, {os.cpu_count()} CPUs; infer/s (p50 ms) per concurrency level {LEVELS}")
            totals = {policy: {"alone": 0.0, "both": 0.0} for policy in POLICIES}
            for attempt in range(1, args.repeat + 1):
                for policy, pair in servers.items():
                    alone = measure(pair[0], args.model, input_json)
                    both = at_once(pair, args.model, input_json)
                    print(f"run {attempt} {policy:8} alone: {fmt(alone)}")
                    print(f"run {attempt} {policy:8} both:  {fmt(both[0])} | {fmt(both[1])}")
                    totals[policy]["alone"] += sum(rate for _, rate, _ in alone)
                    totals[policy]["both"] += sum(rate for _, rate, _ in both[0] + both[1]) / 2
            for policy, total in totals.items():
                ratio = total["both"] / total["alone"] if total["alone"] else float("nan")
                print(f"{policy:8} each server at once / alone: {ratio:.2f}")
            spin, passive = (totals[policy]["alone"] for policy in POLICIES)
            print(f"alone, passive / spin: {passive / spin:.2f}" if spin else "")
        finally:
            for pair in servers.values():
                for server in pair:
                    server.stop()


def fmt(rows: list[tuple[int, float, float]]) -> str:
    return "  ".join(f"c{c} {rate:6.1f} ({p50:5.0f})" for c, rate, p50 in rows) or "no stable window"


if __name__ == "__main__":
    main()

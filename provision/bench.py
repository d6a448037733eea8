"""fab bench: perf_analyzer on every host against each model, results to results/<run-id>/.

The controller builds the perf_analyzer command lines and a real JPEG;
playbooks/bench.yml turns the JPEG into perf_analyzer's input on each host
(client_scripts/make_perf_input.py), runs the command lines there and brings
back the CSVs, logs, deployed configs and host facts; provision.report writes
summary.json, report.md and the plots.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from provision import config, sample_images
from provision import state as state_module
from provision.ansible import run_playbook
from provision.background import reachable_address
from provision.deploy import docker_environment
from provision.model_repo import model_names
from provision.perf import PerfRun, input_encodings
from provision.report import write_report


def results_root(settings: dict) -> Path:
    path = Path(settings.get("results_dir") or "results")
    return path if path.is_absolute() else config.PROJECT_ROOT / path


class BenchError(RuntimeError):
    pass


def triton_endpoints(runtime: str, bind_address: str, ports: dict) -> tuple[str, str | None]:
    """(Triton's HTTP address, its metrics URL or None) as perf_analyzer reaches them on the host.

    process: perf_analyzer runs on the host; Triton listens on bind_address.
    docker:  perf_analyzer runs in the API container; Triton is the `triton`
             container on their network, and its GPU metrics are collected.
    """
    if runtime == "docker":
        return f"triton:{ports['triton_http']}", f"triton:{ports['triton_metrics']}/metrics"
    return f"{reachable_address(bind_address)}:{ports['triton_http']}", None


def perf_runs(models: list[str], url: str, metrics_url: str | None = None, *, profile: dict) -> list[PerfRun]:
    """One perf_analyzer run per model; paths are relative to the host's benchmark folder."""
    return [
        PerfRun(
            model=model,
            url=url,
            metrics_url=metrics_url,
            input_json=Path("input.json"),
            csv_path=Path(f"{model}.csv"),
            concurrency_range=str(profile["concurrency_range"]),
            measurement_interval_ms=int(profile["measurement_interval_ms"]),
            stability_percentage=int(profile["stability_percentage"]),
            max_trials=int(profile["max_trials"]),
            measurement_mode=profile.get("measurement_mode", "time_windows"),
            measurement_request_count=int(profile.get("measurement_request_count", 50)),
        )
        for model in models
    ]


def _git_commit() -> dict:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=config.PROJECT_ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def bench(
    settings: dict,
    state: state_module.State,
    models: list[str] | None = None,
    quick: bool = False,
    say: Callable[[str], None] = print,
) -> Path:
    """Run the benchmark; return the results folder."""
    if state.deploy.get("status") != "deployed":
        raise BenchError(
            "nothing is deployed: run `fab deploy` first"
            + (" (the last deploy did not finish)" if state.deploy.get("status") else "")
        )
    models = list(models or settings["bench"]["models"])
    encoding = settings["bench"].get("input_encoding", "raw")
    if encoding not in input_encodings():
        raise BenchError(f"lab.bench.input_encoding is {encoding!r}: expected one of {', '.join(input_encodings())}")
    profile_name = "quick" if quick else "full"
    profile = dict(settings["bench"][profile_name])
    run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{state.target}"
    results = results_root(settings) / run_id
    for host in state.hosts:  # where the playbook saves each host's results
        (results / "hosts" / host.name / "configs").mkdir(parents=True, exist_ok=True)

    image = results / "input.jpg"  # the host turns it into perf_analyzer's input (client_scripts/make_perf_input.py)
    image.write_bytes(sample_images.jpeg())

    bind = state.deploy["bind_address"]
    ports = state.deploy["ports"]
    runs = perf_runs(models, *triton_endpoints(state.runtime, bind, ports), profile=profile)
    say(f"benchmarking {len(models)} model(s) at concurrency {profile['concurrency_range']} ({profile_name} profile)")
    run_playbook(
        "bench.yml",
        {
            "lab_run_id": run_id,
            "lab_docker_environment": docker_environment(settings),
            "lab_runtime": state.runtime,
            "lab_hosts": state.deploy["hosts"],
            "lab_bind_address": bind,
            "lab_ports": ports,
            "lab_models": model_names(),
            "lab_results_dir": str(results),
            "lab_input_image": str(image),
            "lab_bench_input_encoding": encoding,
            "lab_bench_runs": [{"model": run.model, "args": run.command()[1:]} for run in runs],
        },
        say,
    )
    write_report(
        results,
        run_id=run_id,
        target=state.target,
        profile={"name": profile_name, **profile},
        input_encoding=encoding,
        commands={run.model: shlex.join(run.command()) for run in runs},
        smoke_weights=bool(state.deploy.get("smoke_weights")),
        git=_git_commit(),
    )
    return results

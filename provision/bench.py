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
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from provision import cluster as clusters
from provision import cluster_report, config, runtimes, sample_images, targets
from provision import state as state_module
from provision.ansible import PlaybookError, PlaybookInterrupted, run_playbook
from provision.deploy import docker_environment
from provision.errors import OperationError
from provision.lease_guard import check_bench_fits, hours_to_extend, minutes, next_model_fits
from provision.model_repo import model_names
from provision.perf import PerfRun, fresh_csv, input_encodings, unstable_reason
from provision.report import concurrency_levels, write_report
from provision.state import Host


def results_root(settings: dict) -> Path:
    path = Path(settings.get("results_dir") or "results")
    return path if path.is_absolute() else config.PROJECT_ROOT / path


class BenchError(OperationError):
    pass


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


def git_commit() -> dict:
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
    cluster: bool = False,
) -> Path:
    """Run the benchmark; return the results folder.

    cluster: measure the deployed cluster: each node alone (one after the other), then the
    cluster through its balancer (provision.cluster_report), in the same run.
    """
    if state.deploy.get("status") != "deployed":
        raise BenchError(
            "nothing is deployed: run `fab deploy` first"
            + (" (the last deploy did not finish)" if state.deploy.get("status") else "")
        )
    balancer = _cluster_balancer(state) if cluster else None
    models = list(models or settings["bench"]["models"])
    encoding = settings["bench"].get("input_encoding", "raw")
    if encoding not in input_encodings():
        raise BenchError(f"lab.bench.input_encoding is {encoding!r}: expected one of {', '.join(input_encodings())}")
    profile_name = "quick" if quick else "full"
    profile = dict(settings["bench"][profile_name])
    end = targets.deadline(state.target, state, settings)
    lease = None
    if end is not None:  # before anything is written: a bench that cannot finish does not start
        lease = _Lease(state, settings, end)
        # A cluster's models are measured twice: on each node alone, then through the balancer.
        measurements = len(models) * (2 if cluster else 1)
        check_bench_fits(end, measurements, profile, profile_name, lease.margin_minutes, _now())
    run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{state.target}"
    results = results_root(settings) / run_id
    for host in state.hosts:  # where the playbook saves each host's results
        (results / "hosts" / host.name / "configs").mkdir(parents=True, exist_ok=True)

    image = results / "input.jpg"  # the host turns it into perf_analyzer's input (client_scripts/make_perf_input.py)
    image.write_bytes(sample_images.jpeg())

    ports = state.deploy["ports"]
    bind_addresses = clusters.deployed_bind_addresses(state)
    runs_of = {  # each host's perf_analyzer runs, against its own Triton
        host: perf_runs(models, *runtimes.triton_endpoints(state.runtime, bind, ports), profile=profile)
        for host, bind in bind_addresses.items()
    }
    runs = runs_of[state.hosts[0].name]  # what the report shows (the hosts' differ in the address only)
    say(f"benchmarking {len(models)} model(s) at concurrency {profile['concurrency_range']} ({profile_name} profile)")
    playbook_vars = {
        "lab_run_id": run_id,
        "lab_docker_environment": docker_environment(settings),
        "lab_hosts": state.deploy["hosts"],
        "lab_bench_places": {
            host: runtimes.bench_place(state.runtime, deployed, run_id) for host, deployed in state.deploy["hosts"].items()
        },
        "lab_reachable_addresses": clusters.reachable(bind_addresses),  # where Triton answers on its own host
        "lab_ports": ports,
        "lab_models": model_names(),
        "lab_results_dir": str(results),
        "lab_input_image": str(image),
        "lab_bench_input_encoding": encoding,
    }
    measured, failure = runs, None
    try:
        if balancer is not None:
            _bench_cluster(settings, state, balancer, models, profile, runs_of, playbook_vars, say)
        elif lease is None:
            run_playbook("bench.yml", {**playbook_vars, "lab_bench_runs": _playbook_runs(runs_of, run_id)}, say)
        else:
            measured = _bench_within_the_lease(lease, runs_of, playbook_vars, say)
    except PlaybookError as error:  # a failed measurement, or Ctrl-C (PlaybookInterrupted): keep what was measured
        failure = error
    measured_models = _keep_fresh_measurements(results, run_id, models)
    partial = None
    if failure is not None:
        reason = "interrupted (Ctrl-C or SIGTERM)" if isinstance(failure, PlaybookInterrupted) else failure_reason(failure)
        partial = {"reason": reason, "not_measured": [model for model in models if model not in measured_models]}
    elif len(measured) < len(runs):
        not_measured = [run.model for run in runs[len(measured) :]]
        partial = {"reason": "the lease ends soon", "not_measured": not_measured}
        measured_models = [run.model for run in measured]
    write_report(
        results,
        run_id=run_id,
        target=state.target,
        profile={"name": profile_name, **profile},
        input_encoding=encoding,
        commands={run.model: shlex.join(run.command()) for run in runs if run.model in measured_models},
        smoke_weights=bool(state.deploy.get("smoke_weights")),
        git=git_commit(),
        partial=partial,
    )
    if balancer is not None and failure is None:
        nodes, levels = _cluster_nodes(state), concurrency_levels(profile["concurrency_range"])
        summary = cluster_report.summarize(results, balancer.name, nodes, _cluster_clients(settings, state), levels, models)
        cluster_report.write(results, summary)
    if isinstance(failure, PlaybookInterrupted):
        raise PlaybookInterrupted(f"{failure}\nthe partial results are in {results} (PARTIAL.md)")
    if failure is not None:
        raise BenchError(
            f"the bench stopped: {partial['reason']}\n"
            f"measured: {', '.join(measured_models) or 'nothing'}; not measured: {', '.join(partial['not_measured'])}\n"
            f"the partial results are in {results} (PARTIAL.md)\n\n{failure}"
        )
    if partial:
        left = lease.time_left_s()
        raise BenchError(
            f"stopped before the lease's end ({minutes(left)} left, margin {lease.margin_minutes:g} min): "
            f"measured {', '.join(run.model for run in measured) or 'nothing'}; not measured: "
            f"{', '.join(partial['not_measured'])}.\nThe partial results are in {results} (PARTIAL.md).\n"
            f"To measure the rest: `fab extend --hours {lease.hours_for(len(partial['not_measured']))}`, then "
            f"`fab bench{' --quick' if quick else ''} "
            + " ".join(f"--model={model}" for model in partial["not_measured"])
            + "`"
        )
    return results


# The task of bench.yml that fails with the reason a measurement failed.
MEASUREMENT_FAILED = "Stop where a measurement failed"


def measurement_id(run_id: str, model: str) -> str:
    """What names one model's measurement in a run (bench.yml's log line says it wrote the CSV)."""
    return f"{run_id}/{model}"


def playbook_run(run: PerfRun, measurement: str) -> dict:
    """One entry of bench.yml's lab_bench_runs: the model, its CSV, the measurement's id, perf_analyzer's arguments."""
    return {"model": run.model, "csv": str(run.csv_path), "measurement": measurement, "args": run.command()[1:]}


def _playbook_runs(runs_of: dict[str, list[PerfRun]], run_id: str, index: slice = slice(None)) -> dict[str, list[dict]]:
    """bench.yml's lab_bench_runs: {host: [playbook_run]}, the runs `index` selects."""
    return {
        host: [playbook_run(run, measurement_id(run_id, run.model)) for run in runs[index]]
        for host, runs in runs_of.items()
    }


def failure_reason(failure: PlaybookError) -> str:
    """A failed bench's reason in one line: the failed measurement's, else the first failed task's."""
    message = failure.message_of(MEASUREMENT_FAILED) or next((text for _, _, text in failure.failures), str(failure))
    return " ".join(message.split())  # one line: the partial report's reason


def _keep_fresh_measurements(results: Path, run_id: str, models: list[str]) -> list[str]:
    """The models measured on every host (each host's CSVs checked to come from this run); stale ones removed."""
    measured = set(models)
    for folder in [path for path in (results / "hosts").iterdir() if path.is_dir()]:
        fresh = {
            model
            for model in models
            if fresh_csv(folder / f"{model}.csv", folder / f"{model}.log", measurement_id(run_id, model))
        }
        unstable = {
            model
            for model in models
            if (folder / f"{model}.log").exists() and unstable_reason((folder / f"{model}.log").read_text(errors="replace"))
        }
        measured &= fresh | unstable  # a model with no stable level was measured: the report says so
    return [model for model in models if model in measured]


def _cluster_balancer(state: state_module.State) -> Host:
    """The deployed cluster's balancer host; BenchError where there is no cluster to measure."""
    balancer = clusters.balancer_host(state)
    if balancer is None:
        raise BenchError(
            "no cluster is deployed: `fab deploy --cluster` first (without --cluster, fab bench measures each host alone)"
        )
    return balancer


def _bench_cluster(
    settings: dict,
    state: state_module.State,
    balancer: Host,
    models: list[str],
    profile: dict,
    runs_of: dict[str, list[PerfRun]],
    playbook_vars: dict,
    say: Callable[[str], None],
) -> None:
    """Each node alone, one after the other (one host at a time), then the cluster through the balancer:
    at each level, the clients side by side on the balancer's host (results/<run-id>/cluster/).
    The nodes are the balancer's backends (not a balancer's own node)."""
    nodes = _cluster_nodes(state)
    say(f"each of the {len(nodes)} nodes alone, one after the other")
    alone = {host: runs for host, runs in runs_of.items() if host in nodes}
    run_playbook("bench.yml", {**playbook_vars, "lab_bench_runs": _playbook_runs(alone, playbook_vars["lab_run_id"])}, say, forks=1)

    clients = _cluster_clients(settings, state)
    levels = concurrency_levels(profile["concurrency_range"])
    ports = state.deploy["ports"]
    url = f"{clusters.balancer_address(state)}:{ports['balancer_http']}"
    groups, files = [], ["side_by_side_report.json"]
    for model in models:
        for level in levels:
            (run,) = perf_runs([model], url, profile={**profile, "concurrency_range": f"{level}:{level}"})
            name = cluster_report.group_name(model, level)
            runs = [replace(run, csv_path=Path(cluster_report.client_csv(model, level, k))) for k in range(1, clients + 1)]
            groups.append({"name": name, "runs": [client.command()[1:] for client in runs]})
            files += [str(client.csv_path) for client in runs] + [f"{name}-{k}.log" for k in range(1, clients + 1)]
    results = Path(playbook_vars["lab_results_dir"])
    (results / "cluster").mkdir(parents=True, exist_ok=True)
    say(f"the cluster through the balancer on {balancer.name}: {clients} clients side by side at each concurrency")
    run_playbook(
        "bench.yml",
        {
            **playbook_vars,
            "lab_bench_runs": {},
            "lab_bench_side_by_side": {balancer.name: groups},
            "lab_bench_cluster_place": runtimes.cluster_clients_place(
                state.runtime, state.deploy["hosts"][balancer.name], playbook_vars["lab_run_id"]
            ),
            "lab_bench_side_by_side_files": files,
        },
        say,
        limit=balancer.name,
    )


def _cluster_nodes(state: state_module.State) -> list[str]:
    """The hosts that serve the cluster (its balancer's backends)."""
    return [host.name for host in clusters.backends(state, clusters.of(state))]


def _cluster_clients(settings: dict, state: state_module.State) -> int:
    """How many perf_analyzer clients measure a cluster side by side: lab.bench.cluster_clients, 0: one per node."""
    return int(settings["bench"].get("cluster_clients") or 0) or len(_cluster_nodes(state))


class _Lease:
    """The deadline of the hosts, asked of the target again before each model."""

    def __init__(self, state: state_module.State, settings: dict, end: datetime):
        self.state, self.settings, self.end = state, settings, end
        self.margin_minutes = float(settings["bench"].get("lease_margin_minutes", 15))
        self.longest_model_s = 0.0  # measured by the bench, model by model

    def refresh(self) -> datetime:
        self.end = targets.deadline(self.state.target, self.state, self.settings) or self.end
        return self.end

    def time_left_s(self) -> float:
        return (self.end - _now()).total_seconds()

    def hours_for(self, models: int) -> int:
        """`fab extend --hours N` that lets `models` more models run."""
        return hours_to_extend(models * self.longest_model_s + self.margin_minutes * 60 - self.time_left_s())


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _bench_within_the_lease(lease: _Lease, runs_of: dict[str, list[PerfRun]], playbook_vars: dict, say) -> list[PerfRun]:
    """One playbook run per model while the next one ends before the lease's margin; the runs measured.

    The first model was checked with the others before anything started; each
    later one is checked against the lease's end as the cloud says now and the
    longest model so far. Whatever happens, the last playbook run finishes the
    bench on the hosts (facts, configs, the folder removed).
    """
    measured: list[PerfRun] = []
    runs = next(iter(runs_of.values()))
    for index, run in enumerate(runs):
        if index and not next_model_fits(lease.refresh(), lease.longest_model_s, lease.margin_minutes, _now()):
            say(
                f"the lease ends {lease.end.isoformat(timespec='minutes')}, in {minutes(lease.time_left_s())}: "
                f"{run.model} (about {minutes(lease.longest_model_s)}) would end inside the {lease.margin_minutes:g} min "
                "margin; stopping here"
            )
            run_playbook("bench.yml", {**playbook_vars, "lab_bench_runs": {}, "lab_bench_prepare": False}, say)
            return measured
        started = time.monotonic()
        last = index == len(runs) - 1
        run_playbook(
            "bench.yml",
            {
                **playbook_vars,
                "lab_bench_runs": _playbook_runs(runs_of, playbook_vars["lab_run_id"], slice(index, index + 1)),
                "lab_bench_prepare": index == 0,
                "lab_bench_finish": last,
            },
            say,
        )
        lease.longest_model_s = max(lease.longest_model_s, time.monotonic() - started)
        measured.append(run)
    return measured

"""fab bench: perf_analyzer on every host against each model, results to results/<run-id>/.

The controller builds the perf_analyzer command lines and a real JPEG;
playbooks/bench.yml turns the JPEG into perf_analyzer's input on each host
(client_scripts/make_perf_input.py), runs the command lines there and brings
back the CSVs, logs, deployed configs and host facts; provision.report writes
summary.json, report.md and the plots.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from provision import cluster as clusters
from provision import cluster_report, runtimes
from provision import state as state_module
from provision.ansible import PlaybookError, PlaybookInterrupted, run_playbook
from provision.errors import OperationError, UsageError
from provision.lease_guard import minutes, next_model_fits
from provision.measure import (
    Lease,
    Measurement,
    RunFolder,
    failure_reason,
    git_commit,
    input_encoding,
    lease_for,
    leave_a_copy_on_the_hosts,
    measurement_id,
    now,
    perf_runs,
)
from provision.perf import SCENARIOS, concurrency_levels, fresh_csv, over_the_limit, unstable_reason
from provision.report import write_report
from provision.state import Host

if TYPE_CHECKING:  # loaded from client_scripts/perf_run.py when first used (provision/perf.py)
    from provision.perf import PerfRun


class BenchError(OperationError):
    pass


def bench(
    settings: dict,
    state: state_module.State,
    models: list[str] | None = None,
    quick: bool = False,
    say: Callable[[str], None] = print,
    cluster: bool = False,
    server_p99_ms: float = 0,
) -> Path:
    """Run the benchmark; return the results folder.

    cluster: measure the deployed cluster: each node alone (one after the other), then the
    cluster through its balancer (provision.cluster_report), in the same run.
    server_p99_ms: the server scenario: each model's highest Poisson arrival rate whose p99 stays
    within this bound (provision/server_report.py), instead of closed-loop concurrency.
    """
    balancer = _check_can_bench(state, cluster, server_p99_ms)
    input_encoding(settings)  # a wrong setting stops here, before anything is written
    models = list(models or settings["bench"]["models"])
    profile_name = "quick" if quick else "full"
    profile = dict(settings["bench"][profile_name])
    # Before anything is written: a bench that cannot finish does not start. A cluster's models
    # are measured twice: on each node alone, then through the balancer.
    lease = lease_for(settings, state, len(models) * (2 if cluster else 1), profile, profile_name, bool(server_p99_ms))
    run = RunFolder.create(settings, state.target, [host.name for host in state.hosts], "server" if server_p99_ms else "")
    measurement = Measurement(settings, state, run)
    runs_of = measurement.perf_runs_of(models, profile, server_p99_ms)
    runs = runs_of[state.hosts[0].name]  # what the report shows (the hosts' differ in the address only)
    say(_what_is_measured(models, profile, profile_name, server_p99_ms))
    measured, failure = runs, None
    try:
        if balancer is not None:
            _bench_cluster(measurement, balancer, models, profile, runs_of, say)
        elif lease is None:
            run_playbook(
                "bench.yml", {**measurement.playbook_vars(), "lab_bench_runs": measurement.playbook_runs(runs_of)}, say
            )
        else:
            measured = _bench_within_the_lease(lease, measurement, runs_of, say)
    except PlaybookError as error:  # a failed measurement, or Ctrl-C (PlaybookInterrupted): keep what was measured
        failure = error
    measured_models = _keep_fresh_measurements(run, models)
    partial = _partial(failure, models, measured_models, runs, measured)
    if partial and failure is None:
        measured_models = [perf_run.model for perf_run in measured]
    write_report(
        run.path,
        run_id=run.id,
        target=state.target,
        profile={"name": profile_name, **profile},
        input_encoding=measurement.encoding,
        commands={
            perf_run.model: shlex.join(perf_run.command()) for perf_run in runs if perf_run.model in measured_models
        },
        smoke_weights=bool(state.deploy.get("smoke_weights")),
        git=git_commit(),
        partial=partial,
        server_p99_ms=server_p99_ms,
    )
    if balancer is not None and failure is None:
        nodes, levels = _cluster_nodes(state), concurrency_levels(profile["concurrency_range"])
        summary = cluster_report.summarize(
            run.path, balancer.name, nodes, _cluster_clients(settings, state), levels, models
        )
        cluster_report.write(run, summary)
    leave_a_copy_on_the_hosts(measurement, failure, say)
    _raise_if_stopped(run, failure, partial, measured_models, lease, quick)
    return run.path


def _check_can_bench(state: state_module.State, cluster: bool, server_p99_ms: float) -> Host | None:
    """BenchError where nothing is deployed or the flags do not go together; the cluster's balancer host."""
    if state.deploy.get("status") != "deployed":
        raise BenchError(
            "nothing is deployed: run `fab deploy` first"
            + (" (the last deploy did not finish)" if state.deploy.get("status") else "")
        )
    if cluster and server_p99_ms:
        raise BenchError("--scenario server measures each host alone: drop --cluster (a cluster is measured closed-loop)")
    return _cluster_balancer(state) if cluster else None


def check_scenario(scenario: str) -> str:
    """--scenario, checked: one of perf.SCENARIOS."""
    if scenario not in SCENARIOS:
        raise UsageError(f"--scenario {scenario}: choose one of {', '.join(SCENARIOS)}")
    return scenario


def scenario_bound(scenario: str, p99_ms: float) -> float:
    """The server scenario's p99 bound in ms, 0 for the closed loop; UsageError for a mismatched pair."""
    if check_scenario(scenario) == "server" and not float(p99_ms or 0) > 0:
        raise UsageError("--scenario server needs --p99-ms N: the p99 bound, in ms, that the rate must keep")
    if scenario != "server" and float(p99_ms or 0):
        raise UsageError("--p99-ms is the server scenario's bound: add --scenario server")
    return float(p99_ms or 0)


def _what_is_measured(models: list[str], profile: dict, profile_name: str, server_p99_ms: float) -> str:
    if server_p99_ms:
        return (
            f"benchmarking {len(models)} model(s): the highest Poisson arrival rate of {profile['request_rate_range']} "
            f"requests/s whose p99 stays within {server_p99_ms:g} ms ({profile_name} profile)"
        )
    return f"benchmarking {len(models)} model(s) at concurrency {profile['concurrency_range']} ({profile_name} profile)"


def _partial(failure, models: list[str], measured_models: list[str], runs: list[PerfRun], measured: list[PerfRun]):
    """The report's `partial` ({"reason", "not_measured"}) of a bench that stopped early, else None."""
    if failure is not None:
        reason = (
            "interrupted (Ctrl-C or SIGTERM)" if isinstance(failure, PlaybookInterrupted) else failure_reason(failure)
        )
        return {"reason": reason, "not_measured": [model for model in models if model not in measured_models]}
    if len(measured) < len(runs):
        return {"reason": "the lease ends soon", "not_measured": [perf_run.model for perf_run in runs[len(measured) :]]}
    return None


def _raise_if_stopped(run: RunFolder, failure, partial, measured_models: list[str], lease: Lease | None, quick: bool):
    """A bench that stopped early ends with its error, once its partial results are written."""
    if isinstance(failure, PlaybookInterrupted):
        raise PlaybookInterrupted(f"{failure}\nthe partial results are in {run.path} (PARTIAL.md)")
    if failure is not None:
        raise BenchError(
            f"the bench stopped: {partial['reason']}\n"
            f"measured: {', '.join(measured_models) or 'nothing'}; not measured: {', '.join(partial['not_measured'])}\n"
            f"the partial results are in {run.path} (PARTIAL.md)\n\n{failure}"
        )
    if partial:
        left = lease.time_left_s()
        raise BenchError(
            f"stopped before the lease's end ({minutes(left)} left, margin {lease.margin_minutes:g} min): "
            f"measured {', '.join(measured_models) or 'nothing'}; not measured: "
            f"{', '.join(partial['not_measured'])}.\nThe partial results are in {run.path} (PARTIAL.md).\n"
            f"To measure the rest: `fab extend --hours {lease.hours_for(len(partial['not_measured']))}`, then "
            f"`fab bench{' --quick' if quick else ''} "
            + " ".join(f"--model={model}" for model in partial["not_measured"])
            + "`"
        )


def _keep_fresh_measurements(run: RunFolder, models: list[str]) -> list[str]:
    """The models measured on every host (each host's CSVs checked to come from this run); stale ones removed."""
    measured = set(models)
    for folder in [run.host(name) for name in run.hosts()]:
        fresh = {
            model
            for model in models
            if fresh_csv(folder / f"{model}.csv", folder / f"{model}.log", measurement_id(run.id, model))
        }
        logs = {model: folder / f"{model}.log" for model in models}
        # A model with no stable level, or (the server scenario) none within the bound, was measured: the report says so.
        answered = {
            model
            for model, log in logs.items()
            if log.exists() and (unstable_reason(text := log.read_text(errors="replace")) or over_the_limit(text))
        }
        measured &= fresh | answered
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
    measurement: Measurement,
    balancer: Host,
    models: list[str],
    profile: dict,
    runs_of: dict[str, list[PerfRun]],
    say: Callable[[str], None],
) -> None:
    """Each node alone, one after the other (one host at a time), then the cluster through the balancer:
    at each level, the clients side by side on the balancer's host (results/<run-id>/cluster/).
    The nodes are the balancer's backends (not a balancer's own node)."""
    state, run = measurement.state, measurement.run
    nodes = _cluster_nodes(state)
    say(f"each of the {len(nodes)} nodes alone, one after the other")
    alone = {host: runs for host, runs in runs_of.items() if host in nodes}
    playbook_vars = measurement.playbook_vars()
    run_playbook("bench.yml", {**playbook_vars, "lab_bench_runs": measurement.playbook_runs(alone)}, say, forks=1)

    clients = _cluster_clients(measurement.settings, state)
    levels = concurrency_levels(profile["concurrency_range"])
    url = f"{clusters.balancer_address(state)}:{measurement.ports['balancer_http']}"
    groups, files = [], ["side_by_side_report.json"]
    for model in models:
        for level in levels:
            (perf_run,) = perf_runs([model], url, profile={**profile, "concurrency_range": f"{level}:{level}"})
            name = cluster_report.group_name(model, level)
            runs = [
                replace(perf_run, csv_path=Path(cluster_report.client_csv(model, level, k)))
                for k in range(1, clients + 1)
            ]
            groups.append({"name": name, "runs": [client.command()[1:] for client in runs]})
            files += [str(client.csv_path) for client in runs] + [f"{name}-{k}.log" for k in range(1, clients + 1)]
    (run.path / "cluster").mkdir(parents=True, exist_ok=True)
    say(f"the cluster through the balancer on {balancer.name}: {clients} clients side by side at each concurrency")
    run_playbook(
        "bench.yml",
        {
            **playbook_vars,
            "lab_bench_runs": {},
            "lab_bench_side_by_side": {balancer.name: groups},
            "lab_bench_cluster_place": runtimes.cluster_clients_place(
                state.runtime, state.deploy["hosts"][balancer.name], run.id
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


def _bench_within_the_lease(
    lease: Lease, measurement: Measurement, runs_of: dict[str, list[PerfRun]], say
) -> list[PerfRun]:
    """One playbook run per model while the next one ends before the lease's margin; the runs measured.

    The first model was checked with the others before anything started; each
    later one is checked against the lease's end as the cloud says now and the
    longest model so far. Whatever happens, the last playbook run finishes the
    bench on the hosts (facts, configs, the folder removed).
    """
    measured: list[PerfRun] = []
    playbook_vars = measurement.playbook_vars()
    runs = next(iter(runs_of.values()))
    for index, perf_run in enumerate(runs):
        if index and not next_model_fits(lease.refresh(), lease.longest_model_s, lease.margin_minutes, now()):
            say(
                f"the lease ends {lease.end.isoformat(timespec='minutes')}, in {minutes(lease.time_left_s())}: "
                f"{perf_run.model} (about {minutes(lease.longest_model_s)}) would end inside the "
                f"{lease.margin_minutes:g} min margin; stopping here"
            )
            run_playbook("bench.yml", {**playbook_vars, "lab_bench_runs": {}, "lab_bench_prepare": False}, say)
            return measured
        started = time.monotonic()
        run_playbook(
            "bench.yml",
            {
                **playbook_vars,
                "lab_bench_runs": measurement.playbook_runs(runs_of, slice(index, index + 1)),
                "lab_bench_prepare": index == 0,
                "lab_bench_finish": index == len(runs) - 1,
            },
            say,
        )
        lease.longest_model_s = max(lease.longest_model_s, time.monotonic() - started)
        measured.append(perf_run)
    return measured

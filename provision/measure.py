"""Measurement runs: the results folder that a bench or a tune writes, and what bench.yml measures with.

- A RunFolder is created with its id and is the one writer of summary.json and
  PARTIAL.md. The folder's format, and its reader, are
  client_scripts/run_folder.py (standard library: compare_runs.py and the
  notebook read runs through it too).
- A Measurement is playbooks/bench.yml's variable contract (run id, runtime
  environment, hosts, where perf_analyzer runs, addresses, ports, models,
  input and its encoding), built once from the settings, the state and the
  hosts measured. `fab bench`, its cluster form and `fab tune` use it.
- lease_for() checks, before anything is written, that the measurements fit
  in the hosts' lease (provision/lease_guard.py), and returns the Lease the
  bench asks again before each model.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from provision import cluster as clusters
from provision import config, perf, runtimes, sample_images, targets
from provision import state as state_module
from provision.ansible import PlaybookError, PlaybookInterrupted, run_playbook
from provision.errors import OperationError
from provision.lease_guard import check_bench_fits, hours_to_extend
from provision.model_repo import model_names
from provision.perf import input_encodings, rate_search_steps

if TYPE_CHECKING:  # loaded from client_scripts/perf_run.py when first used (provision/perf.py)
    from provision.perf import PerfRun


def run_folder():
    """client_scripts/run_folder.py, the format of a run folder: loaded when first used, so that the
    package imports where the project's scripts are not beside it (an installed wheel)."""
    return config.client_script("run_folder")


class MeasurementError(OperationError):
    """A measurement cannot start (a wrong setting); the message says what to change."""


def results_root(settings: dict) -> Path:
    """lab.results_dir: where the runs are (relative to the project)."""
    path = Path(settings.get("results_dir") or "results")
    return path if path.is_absolute() else config.PROJECT_ROOT / path


def runs(settings: dict) -> list[Path]:
    """The runs under results/, finished or not, oldest first."""
    return run_folder().runs(results_root(settings))


class RunFolder:
    """One results/<run-id>/ folder (client_scripts/run_folder.py has its parts)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def create(cls, settings: dict, target: str, hosts: Iterable[str], kind: str = "") -> RunFolder:
        """A new run: its folder, each host's, and the benchmark image that perf_analyzer's input is made from."""
        run = cls(results_root(settings) / run_folder().new_id(target, kind))
        run.path.mkdir(parents=True)
        for host in hosts:  # where bench.yml saves each host's results
            run.configs(host).mkdir(parents=True, exist_ok=True)
        run.input_image.write_bytes(sample_images.jpeg())
        return run

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def input_image(self) -> Path:
        return self.path / run_folder().INPUT_IMAGE

    def host(self, name: str) -> Path:
        return run_folder().host_folder(self.path, name)

    def configs(self, host: str) -> Path:
        return run_folder().configs_folder(self.path, host)

    def hosts(self) -> list[str]:
        """The hosts whose results are here."""
        folder = self.path / run_folder().HOSTS
        return sorted(path.name for path in folder.iterdir() if path.is_dir()) if folder.is_dir() else []

    def read_summary(self) -> dict:
        return run_folder().read_summary(self.path)

    def write_summary(self, summary: dict) -> None:
        (self.path / run_folder().SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")

    def add_to_summary(self, key: str, value) -> None:
        """One more part of summary.json (the cluster's figures, written after the rest)."""
        self.write_summary({**self.read_summary(), key: value})

    def mark_partial(self, why: str) -> None:
        """PARTIAL.md: the run stopped early, and `why` (a sentence) says why and what is missing."""
        (self.path / run_folder().PARTIAL).write_text(f"# Partial run\n\n{why}\n")

    def is_partial(self) -> bool:
        return run_folder().is_partial(self.path)

    def is_complete(self) -> bool:
        return run_folder().is_complete(self.path)


def git_commit() -> dict:
    """The project's commit, and whether tracked files differ from it: a run says what code measured it."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=config.PROJECT_ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


# --------------------------------------------------------------------------- perf_analyzer on the hosts


def perf_runs(
    models: list[str], url: str, metrics_url: str | None = None, *, profile: dict, server_p99_ms: float = 0
) -> list[PerfRun]:
    """One perf_analyzer run per model; paths are relative to the host's benchmark folder.

    server_p99_ms: the server scenario, searching profile["request_rate_range"] for the highest
    Poisson arrival rate whose p99 stays within it (else closed-loop, over the concurrency range).
    """
    return [
        perf.PerfRun(
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
            request_rate_range=str(profile["request_rate_range"]) if server_p99_ms else "",
            latency_threshold_ms=float(server_p99_ms),
        )
        for model in models
    ]


# The task of bench.yml that fails with the reason a measurement failed.
MEASUREMENT_FAILED = "Stop where a measurement failed"


def measurement_id(run_id: str, model: str) -> str:
    """What names one model's measurement in a run (bench.yml's log line says it wrote the CSV)."""
    return f"{run_id}/{model}"


def playbook_run(run: PerfRun, measurement: str, warm_up: bool = True) -> dict:
    """One entry of bench.yml's lab_bench_runs: the model, its files' name (the CSV's), its CSV, the
    measurement's id, perf_analyzer's arguments, the warm-up's (none: warm_up False, the model is warm)."""
    return {
        "model": run.model, "name": run.csv_path.stem, "csv": str(run.csv_path), "measurement": measurement,
        "args": run.command()[1:], "warmup_args": run.warmup_args() if warm_up else [],
    }  # fmt: skip


def failure_reason(failure: PlaybookError) -> str:
    """A failed measurement's reason in one line: the failed measurement's, else the first failed task's."""
    message = failure.message_of(MEASUREMENT_FAILED) or next((text for _, _, text in failure.failures), str(failure))
    return " ".join(perf.without_usage(message).split())  # one line: the partial report's reason


def input_encoding(settings: dict) -> str:
    """lab.bench.input_encoding, checked: how perf_analyzer sends the image (raw bytes or base64 text)."""
    encoding = settings["bench"].get("input_encoding", "raw")
    if encoding not in input_encodings():
        raise MeasurementError(
            f"lab.bench.input_encoding is {encoding!r}: expected one of {', '.join(input_encodings())}"
        )
    return encoding


@dataclass
class Measurement:
    """bench.yml's variables for one run on some of the deployed hosts (all of them unless `hosts` says)."""

    settings: dict
    state: state_module.State
    run: RunFolder
    hosts: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.hosts = self.hosts or [host.name for host in self.state.hosts]
        self.encoding = input_encoding(self.settings)
        everywhere = clusters.deployed_bind_addresses(self.state)
        self.bind_addresses = {host: everywhere[host] for host in self.hosts}

    @property
    def ports(self) -> dict:
        return self.state.deploy["ports"]

    def perf_runs_of(self, models: list[str], profile: dict, server_p99_ms: float = 0) -> dict[str, list[PerfRun]]:
        """Each host's perf_analyzer runs, against its own Triton (server_p99_ms: the server scenario)."""
        return {
            host: perf_runs(
                models, *runtimes.triton_endpoints(self.state.runtime, bind, self.ports), profile=profile,
                server_p99_ms=server_p99_ms,
            )  # fmt: skip
            for host, bind in self.bind_addresses.items()
        }

    def playbook_runs(self, runs_of: dict[str, list[PerfRun]], index: slice = slice(None)) -> dict[str, list[dict]]:
        """bench.yml's lab_bench_runs: {host: [playbook_run]}, the runs `index` selects."""
        return {
            host: [playbook_run(run, measurement_id(self.run.id, run.model)) for run in runs[index]]
            for host, runs in runs_of.items()
        }

    def playbook_vars(self) -> dict:
        """What every bench.yml (and tune.yml) run of this measurement is given."""
        deployed = self.state.deploy["hosts"]
        return {
            "lab_run_id": self.run.id,
            "lab_environment": runtimes.playbook_environment(self.state.runtime, self.settings),
            "lab_hosts": deployed,
            "lab_bench_places": {
                host: runtimes.bench_place(self.state.runtime, deployed[host], self.run.id) for host in self.hosts
            },
            "lab_reachable_addresses": clusters.reachable(self.bind_addresses),  # where Triton answers on its host
            "lab_ports": self.ports,
            "lab_models": model_names(),
            "lab_results_dir": str(self.run.path),
            "lab_input_image": str(self.run.input_image),
            "lab_bench_input_encoding": self.encoding,
        }


def leave_a_copy_on_the_hosts(measurement: Measurement, failure: PlaybookError | None, say) -> None:
    """The finished run (partial ones too) on each host measured, where the profiling notebook looks
    (playbooks/share_run.yml); not after Ctrl-C. A host that cannot take it is named, the bench goes on:
    the controller's copy is the record."""
    if isinstance(failure, PlaybookInterrupted):
        return
    run = measurement.run
    with tempfile.TemporaryDirectory() as folder:
        archive = shutil.make_archive(str(Path(folder) / run.id), "gztar", run.path.parent, run.id)
        variables = {"lab_hosts": measurement.state.deploy["hosts"], "lab_run_id": run.id, "lab_run_archive": archive}
        try:
            run_playbook("share_run.yml", variables, lambda line: None, limit=",".join(measurement.hosts))
        except PlaybookError as error:
            say(f"warning: the run was not copied to the hosts for the notebook ({failure_reason(error)})")


# --------------------------------------------------------------------------- the lease


class Lease:
    """The deadline of the hosts, asked of the target again before each model."""

    def __init__(self, state: state_module.State, settings: dict, end: datetime):
        self.state, self.settings, self.end = state, settings, end
        self.margin_minutes = float(settings["bench"].get("lease_margin_minutes", 15))
        self.longest_model_s = 0.0  # measured by the bench, model by model

    def refresh(self) -> datetime:
        self.end = targets.deadline(self.state.target, self.state, self.settings) or self.end
        return self.end

    def time_left_s(self) -> float:
        return (self.end - now()).total_seconds()

    def hours_for(self, models: int) -> int:
        """`fab extend --hours N` that lets `models` more models run."""
        return hours_to_extend(models * self.longest_model_s + self.margin_minutes * 60 - self.time_left_s())


def lease_for(
    settings: dict, state: state_module.State, measurements: int, profile: dict, profile_name: str, server: bool = False
):
    """The hosts' Lease, once `measurements` model measurements of `profile` are checked to fit in it
    (LeaseTooShort names the `fab extend` to run); None on a target whose hosts have no end.

    server: the server scenario's search measures up to perf.rate_search_steps rates, each counted
    as a concurrency level is."""
    end = targets.deadline(state.target, state, settings)
    if end is None:
        return None
    if server:
        profile = {**profile, "concurrency_range": f"1:{rate_search_steps(profile['request_rate_range'])}"}
    lease = Lease(state, settings, end)
    check_bench_fits(end, measurements, profile, profile_name, lease.margin_minutes, now())
    return lease


def now() -> datetime:
    return datetime.now(timezone.utc)

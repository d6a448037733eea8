"""The `process` runtime on a serving host: tritonserver and the API as background processes.

The deploy role copies this package to the host and drives it with one
command per step; every command prints one JSON line whose "changed" field
Ansible reads, so a second deploy with nothing changed reports no change.

    python -m provision.host.process_runtime --config HOME/runtime.json install-triton
    python -m provision.host.process_runtime --config HOME/runtime.json check-ports
    python -m provision.host.process_runtime --config HOME/runtime.json start triton|api|jupyter
    python -m provision.host.process_runtime --config HOME/runtime.json restart triton|api|jupyter
    python -m provision.host.process_runtime --config HOME/runtime.json stop triton|api|jupyter|all
        (all: also ends any process left that names HOME, and the servers' shared memory)
    python -m provision.host.process_runtime --config HOME/runtime.json status
    python -m provision.host.process_runtime --config HOME/runtime.json pids
        ({"triton": pid, "api": pid}: the main processes, as provision.host.container_runtime's pids)

runtime.json (rendered by the role) names the paths and ports:
    {"home": ..., "serving_python": ..., "triton_wheel": ..., "bind_address": "127.0.0.1",
     "ports": {"triton_http": 8000, "triton_grpc": 8001, "triton_metrics": 8002, "api": 8080, "jupyter": 8888},
     "models": [...], "ready_timeout_s": 300}
Standard library only (plus this package's other standard-library modules).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from provision.host.background import (
    PLAYBOOK_RUN_VARIABLE,
    BackgroundProcess,
    end,
    environment,
    port_holder,
    port_is_free,
    processes,
)
from provision.host.layout import TOKEN_FILE, http_json, run_dir
from provision.host.tritonserver import TritonError, TritonProcess, TritonRuntime, install, perf_analyzer_env

SERVICES = ("triton", "api", "jupyter")


@dataclass
class RuntimeConfig:
    home: Path
    serving_python: str
    triton_wheel: str
    bind_address: str
    ports: dict
    models: list
    ready_timeout_s: float = 300

    @classmethod
    def load(cls, path: Path) -> RuntimeConfig:
        data = json.loads(Path(path).read_text())
        return cls(
            home=Path(data["home"]),
            serving_python=data["serving_python"],
            triton_wheel=data["triton_wheel"],
            bind_address=data.get("bind_address", "127.0.0.1"),
            ports=data["ports"],
            models=data.get("models", []),
            ready_timeout_s=float(data.get("ready_timeout_s", 300)),
        )

    @property
    def run_dir(self) -> Path:
        return run_dir(self.home)


def triton(config: RuntimeConfig) -> TritonProcess:
    return TritonProcess(
        runtime_root=config.home / "triton",
        model_repository=config.home / "models",
        state_dir=config.run_dir,
        http_port=config.ports["triton_http"],
        grpc_port=config.ports["triton_grpc"],
        metrics_port=config.ports["triton_metrics"],
        host=config.bind_address,
    )


def _answers_200(url: str) -> bool:
    return http_json(url, timeout=2)[0] == 200


def _launch_and_wait(service, what: str, timeout_s: float, cwd: Path | None = None) -> None:
    """Launch `service` unless it runs, then wait until service.healthy(); fail with its log's tail."""
    if service.process.pid() is None:
        service.process.launch(service.command(), service.environment(), cwd=cwd)
    deadline = time.monotonic() + timeout_s
    while not service.healthy():
        if service.process.pid() is None:
            raise TritonError(f"{what} exited during start-up.\n{service.process.log_tail()}")
        if time.monotonic() > deadline:
            raise TritonError(f"{what} is not up after {timeout_s:.0f} s.\n{service.process.log_tail()}")
        time.sleep(0.3)


@dataclass
class ApiService:
    """The FastAPI app (client_scripts/api.py) under uvicorn."""

    config: RuntimeConfig

    def __post_init__(self):
        self.process = BackgroundProcess("api", self.config.run_dir, stop_timeout_s=10)

    @property
    def url(self) -> str:
        return f"http://{self.config.bind_address}:{self.config.ports['api']}"

    def command(self) -> list[str]:
        return [
            self.config.serving_python,
            "-m",
            "uvicorn",
            "api:app",
            "--app-dir",
            str(self.config.home / "client_scripts"),
            "--host",
            self.config.bind_address,
            "--port",
            str(self.config.ports["api"]),
        ]

    def environment(self) -> dict:
        env = dict(os.environ)
        env["TRITON_URL"] = f"{self.config.bind_address}:{self.config.ports['triton_http']}"
        return env

    def healthy(self) -> bool:
        return _answers_200(f"{self.url}/healthz")

    def start(self, timeout_s: float = 60) -> None:
        _launch_and_wait(self, "the API", timeout_s)


@dataclass
class JupyterService:
    """JupyterLab on the client scripts (profiling.ipynb), behind a token.

    The token is made on the host, kept in run/jupyter.token (mode 0600) and
    handed over in JUPYTER_TOKEN, never on the command line (ps would show
    it); WARN logging keeps Jupyter from printing URLs with the token.
    """

    config: RuntimeConfig

    def __post_init__(self):
        self.process = BackgroundProcess("jupyter", self.config.run_dir, stop_timeout_s=10)
        self.token_file = self.config.home / TOKEN_FILE

    @property
    def url(self) -> str:
        return f"http://{self.config.bind_address}:{self.config.ports['jupyter']}"

    def token(self) -> str:
        if not self.token_file.exists():
            self.config.run_dir.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as file:
                file.write(secrets.token_urlsafe(32))
        return self.token_file.read_text().strip()

    def command(self) -> list[str]:
        command = [
            self.config.serving_python, "-m", "jupyter", "lab", "--no-browser",
            "--ip", self.config.bind_address, "--port", str(self.config.ports["jupyter"]),
            f"--ServerApp.root_dir={self.config.home / 'client_scripts'}",
            "--ServerApp.log_level=WARN",
        ]  # fmt: skip
        if os.geteuid() == 0:
            command.append("--allow-root")  # e.g. a container or a test host; it listens on bind_address only
        return command

    def environment(self) -> dict:
        # The notebook profiles the models itself: perf_analyzer of the serving virtualenv, with its libraries.
        env = perf_analyzer_env(self.config.home / "triton", dict(os.environ))
        env["JUPYTER_TOKEN"] = self.token()
        env["TRITON_URL"] = f"{self.config.bind_address}:{self.config.ports['triton_http']}"
        env["PERF_ANALYZER"] = str(Path(self.config.serving_python).parent / "perf_analyzer")
        return env

    def healthy(self) -> bool:
        """Up and accepting our token."""
        return self.token_file.exists() and _answers_200(f"{self.url}/api/status?token={self.token()}")

    def start(self, timeout_s: float = 90) -> None:
        _launch_and_wait(self, "Jupyter", timeout_s, cwd=self.config.home)


def _ports_of(service: str, config: RuntimeConfig) -> list[int]:
    if service == "triton":
        return [config.ports[name] for name in ("triton_http", "triton_grpc", "triton_metrics")]
    return [config.ports[service]]


def _service(service: str, config: RuntimeConfig):
    return {"api": ApiService, "jupyter": JupyterService}[service](config)


def _process(service: str, config: RuntimeConfig):
    return triton(config) if service == "triton" else _service(service, config).process


def check_ports(config: RuntimeConfig) -> dict:
    """Ports that another program holds (ours may hold their own ports)."""
    busy = {}
    for service in SERVICES:
        if _process(service, config).pid() is not None:
            continue
        for port in _ports_of(service, config):
            if not port_is_free(port, config.bind_address):
                busy[str(port)] = service
    return busy


def _runs_with(pid: int, command: list[str]) -> bool:
    """Whether the process `pid` runs exactly `command`."""
    try:
        running = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        return False
    return running == [part.encode() for part in command]


def start(service: str, config: RuntimeConfig) -> bool:
    """Start a service unless it runs; wait until it is ready. True if it was started."""
    if service == "triton":
        server = triton(config)
        pid = server.pid()
        # A server started with other flags (an older deploy's, e.g. before explicit model
        # control) is restarted: the deploy may rely on what the current command enables.
        if pid is not None and not _runs_with(pid, server.command()):
            server.stop()
            pid = None
        server.start(config.models, config.ready_timeout_s)
        return pid is None
    other = _service(service, config)
    was_running = other.process.pid() is not None
    other.start()
    return not was_running


def stop(service: str, config: RuntimeConfig) -> bool:
    return _process(service, config).stop()


def leftovers(config: RuntimeConfig) -> dict[int, str]:
    """Processes of this deployment that no service owns any more: pid -> command line.

    Ours are those whose command line names the deploy folder (the servers, stubs, the API
    and Jupyter all run from it). Not leftovers: this command and the processes that run it,
    and any process of an Ansible run (it carries the run's mark in its environment): where
    the controller is this host itself, reached over SSH, its ssh client names the folder too.
    """
    table = processes()
    callers, pid = set(), os.getpid()
    while pid in table and pid not in callers:
        callers.add(pid)
        pid = table[pid]["ppid"]
    marker = f"{config.home}/"
    return {
        pid: process["command"]
        for pid, process in table.items()
        if marker in process["command"]
        and pid not in callers
        and process["state"] != "Z"
        and not environment(pid).get(PLAYBOOK_RUN_VARIABLE)
    }


def stop_all(config: RuntimeConfig) -> dict:
    """Stop every service, then end what they left (TERM, then KILL): what teardown verifies is gone."""
    stopped = [service for service in SERVICES[::-1] if stop(service, config)]
    left = leftovers(config)
    survivors = end(list(left))
    return {
        "changed": bool(stopped or left),
        "stopped": stopped,
        "ended": [f"{pid} {command}" for pid, command in left.items() if pid not in survivors],
        "survivors": [f"{pid} {left[pid]}" for pid in survivors],
    }


def status(config: RuntimeConfig) -> dict:
    server, api, jupyter = triton(config), ApiService(config), JupyterService(config)
    return {
        "triton": {
            "pid": server.pid(),
            "url": server.url,
            "ready": server.is_ready(),
            "models": server.model_states() or {},
            "log": str(server.log_file),
        },
        "api": {"pid": api.process.pid(), "url": api.url, "healthy": api.healthy(), "log": str(api.process.log_file)},
        "jupyter": {
            "pid": jupyter.process.pid(),
            "healthy": jupyter.healthy(),
            # The URL with the token: printed by `fab status` to the user's terminal, never logged.
            "url": f"{jupyter.url}/lab?token={jupyter.token()}" if jupyter.token_file.exists() else jupyter.url,
            "log": str(jupyter.process.log_file),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True, help="the runtime.json the deploy role rendered")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("install-triton", help="lay out tritonserver for the serving Python")
    commands.add_parser("check-ports", help="fail if another program holds one of our ports")
    for name in ("start", "restart", "stop"):
        sub = commands.add_parser(name)
        sub.add_argument("service", choices=SERVICES + (("all",) if name == "stop" else ()))
    commands.add_parser("status", help="pids, health and model states")
    commands.add_parser("pids", help="the pids of tritonserver and the API server (JSON)")
    args = parser.parse_args(argv)
    config = RuntimeConfig.load(args.config)

    try:
        if args.command == "install-triton":
            runtime = TritonRuntime(config.home / "triton")
            before = runtime.manifest.read_text() if runtime.manifest.exists() else None
            install(runtime.root, config.serving_python, config.triton_wheel)
            result = {"changed": runtime.manifest.read_text() != before}
        elif args.command == "check-ports":
            busy = check_ports(config)
            if busy:
                ports = ", ".join(f"{port} ({service})" for port, service in busy.items())
                holders = "; ".join(
                    f"{port} is held by {port_holder(int(port)) or 'a process of another user (sudo ss -ltnp shows it)'}"
                    for port in busy
                )
                raise TritonError(
                    f"port(s) {ports} already in use on this host by another program: {holders}. "
                    "Stop it, or choose other ports (lab.ports in your fabric.yaml, or FABRIC_LAB_PORTS_<NAME>; `fab config` shows them)"
                )
            result = {"changed": False}
        elif args.command == "start":
            result = {"changed": start(args.service, config)}
        elif args.command == "restart":
            stop(args.service, config)
            start(args.service, config)
            result = {"changed": True}
        elif args.command == "stop" and args.service == "all":
            result = stop_all(config)
        elif args.command == "stop":
            result = {"changed": stop(args.service, config), "stopped": [args.service]}
        elif args.command == "pids":
            result = {"triton": triton(config).pid(), "api": ApiService(config).process.pid()}
        else:
            result = {"changed": False, **status(config)}
    except TritonError as error:
        print(json.dumps({"changed": False, "failed": True, "msg": str(error)}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

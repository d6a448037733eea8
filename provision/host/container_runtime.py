"""The docker runtime on the host: what `fab status` and `fab logs` ask about the containers.

Runs on the GPU host with its system Python (standard library only), in the
deploy folder that holds compose.yaml:

    python3 -m provision.host.container_runtime --home ~/triton-lab status
    python3 -m provision.host.container_runtime --home ~/triton-lab logs triton --lines 50
    python3 -m provision.host.container_runtime --home ~/triton-lab restart triton
    python3 -m provision.host.container_runtime --home ~/triton-lab pids

`status` prints one JSON object shaped like provision.host.process_runtime's
(triton, api, jupyter: health, URLs, model states), with the container's
name and state where that has a pid.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from provision.host.layout import RUNTIME_JSON, TOKEN_FILE, http_json, reachable_address

# Relative to the deploy folder: compose.yaml hands it to the API container as a
# secret; the process runtime keeps its token at the same path.
SERVICES = {"triton": "triton", "api": "api", "jupyter": "api"}  # fab's service -> compose service


def compose(home: Path, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """`docker compose` on the deployment, with the engine the deploy used."""
    return subprocess.run(
        ["docker", "compose", "--file", str(home / "compose.yaml"), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=_engine_environment(home),
    )


def _engine_environment(home: Path) -> dict:
    """The environment of a docker command on the deployment: the engine the deploy used (runtime.json's docker_host)."""
    env = dict(os.environ)
    runtime_json = home / RUNTIME_JSON
    docker_host = json.loads(runtime_json.read_text()).get("docker_host") if runtime_json.exists() else ""
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    return env


def containers(home: Path) -> dict[str, dict]:
    """{compose service: {"name", "state", "health"}} of the running project."""
    done = compose(home, "ps", "--all", "--format", "json")
    if done.returncode != 0:
        return {}
    text = done.stdout.strip()
    # Compose >= 2.21 prints one JSON object per line, older releases one array.
    entries = json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines() if line]
    return {
        entry["Service"]: {
            "name": entry.get("Name"),
            "state": entry.get("State"),
            "health": entry.get("Health") or None,
        }
        for entry in entries
    }


def status(home: Path, bind_address: str, ports: dict) -> dict:
    address = reachable_address(bind_address)  # a published port answers on the loopback too
    running = containers(home)
    triton_url = f"http://{address}:{ports['triton_http']}"
    ready, _ = http_json(f"{triton_url}/v2/health/ready")
    _, index = http_json(f"{triton_url}/v2/repository/index", method="POST", body=b"{}")
    api_url = f"http://{address}:{ports['api']}"
    healthy, _ = http_json(f"{api_url}/healthz")
    jupyter_url = f"http://{address}:{ports['jupyter']}"
    token_file = home / TOKEN_FILE
    token = token_file.read_text().strip() if token_file.exists() else ""
    jupyter, _ = http_json(f"{jupyter_url}/api/status?token={token}") if token else (0, None)

    def container(service: str) -> str | None:
        info = running.get(service)
        return f"{info['name']} {info['state']}" if info else None

    return {
        "triton": {
            "pid": container("triton"),
            "url": triton_url,
            "ready": ready == 200,
            "models": {entry["name"]: entry.get("state", "UNKNOWN") for entry in index or []},
            "log": "fab logs --service triton",
        },
        "api": {"pid": container("api"), "url": api_url, "healthy": healthy == 200, "log": "fab logs --service api"},
        "jupyter": {
            "pid": container("api"),
            "healthy": jupyter == 200,
            # The URL with the token: printed by `fab status` to the user's terminal, never logged.
            "url": f"{jupyter_url}/lab?token={token}" if token else jupyter_url,
            "log": "fab logs --service jupyter",
        },
    }


def main_pids(home: Path) -> dict[str, int | None]:
    """{"triton", "api"}: the host's pid of tritonserver and of the API's server (uvicorn, a child of the
    container's entrypoint shell), as provision.host.process_runtime's `pids` gives its own."""
    running = containers(home)

    def pid_of(service: str) -> int | None:
        name = (running.get(service) or {}).get("name")
        if not name:
            return None
        inspect = ["docker", "inspect", "--format", "{{.State.Pid}}", name]
        done = subprocess.run(inspect, capture_output=True, text=True, env=_engine_environment(home))
        pid = int(done.stdout.strip() or 0) if done.returncode == 0 else 0
        return pid or None

    api = pid_of("api")
    uvicorn = [child for child in _descendants(api) if "uvicorn" in _command_line(child)] if api else []
    return {"triton": pid_of("triton"), "api": uvicorn[0] if uvicorn else api}


def _descendants(pid: int) -> list[int]:
    below = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            below.append(int(stat.parent.name))
    return below + [grandchild for child in below for grandchild in _descendants(child)]


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, required=True, help="the deploy folder (holds compose.yaml)")
    commands = parser.add_subparsers(dest="command", required=True)
    status_parser = commands.add_parser("status", help="containers, health and model states (JSON)")
    status_parser.add_argument("--runtime-json", type=Path, help="default: HOME/runtime.json")
    logs_parser = commands.add_parser("logs", help="a service's recent log")
    logs_parser.add_argument("service", choices=sorted(SERVICES))
    logs_parser.add_argument("--lines", type=int, default=50)
    restart_parser = commands.add_parser("restart", help="restart a service's container")
    restart_parser.add_argument("service", choices=sorted(SERVICES))
    commands.add_parser("pids", help="the host's pids of tritonserver and the API server (JSON)")
    args = parser.parse_args(argv)
    home = args.home.expanduser()
    if args.command == "logs":
        done = compose(home, "logs", "--no-color", "--tail", str(args.lines), SERVICES[args.service])
        sys.stdout.write(done.stdout + done.stderr)
        return done.returncode
    if args.command == "restart":
        done = compose(home, "restart", SERVICES[args.service], timeout_s=300)
        sys.stderr.write(done.stdout + done.stderr)
        return done.returncode
    if args.command == "pids":
        print(json.dumps(main_pids(home)))
        return 0
    runtime = json.loads((args.runtime_json or home / RUNTIME_JSON).read_text())
    print(json.dumps({"changed": False, **status(home, runtime["bind_address"], runtime["ports"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

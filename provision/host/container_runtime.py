"""The docker runtime on the host: what `fab status` and `fab logs` ask about the containers.

Runs on the GPU host with its system Python (standard library only), in the
deploy folder that holds compose.yaml:

    python3 -m provision.host.container_runtime --home ~/triton-lab status
    python3 -m provision.host.container_runtime --home ~/triton-lab logs triton --lines 50

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
    """`docker compose` on the deployment, with the engine the deploy used (runtime.json's docker_host)."""
    env = dict(os.environ)
    runtime_json = home / RUNTIME_JSON
    docker_host = json.loads(runtime_json.read_text()).get("docker_host") if runtime_json.exists() else ""
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    return subprocess.run(
        ["docker", "compose", "--file", str(home / "compose.yaml"), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, required=True, help="the deploy folder (holds compose.yaml)")
    commands = parser.add_subparsers(dest="command", required=True)
    status_parser = commands.add_parser("status", help="containers, health and model states (JSON)")
    status_parser.add_argument("--runtime-json", type=Path, help="default: HOME/runtime.json")
    logs_parser = commands.add_parser("logs", help="a service's recent log")
    logs_parser.add_argument("service", choices=sorted(SERVICES))
    logs_parser.add_argument("--lines", type=int, default=50)
    args = parser.parse_args(argv)
    home = args.home.expanduser()
    if args.command == "logs":
        done = compose(home, "logs", "--no-color", "--tail", str(args.lines), SERVICES[args.service])
        sys.stdout.write(done.stdout + done.stderr)
        return done.returncode
    runtime = json.loads((args.runtime_json or home / RUNTIME_JSON).read_text())
    print(json.dumps({"changed": False, **status(home, runtime["bind_address"], runtime["ports"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

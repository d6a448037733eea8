"""The local target's serving stack: rendered repository + a real tritonserver.

Shared by `make demo`, the tests and the benchmarks, so there is one way the
local server is assembled. Its command line:

    python -m provision.local_serving install
    python -m provision.local_serving start [--model-repository DIR] [--model M]
    python -m provision.local_serving status
    python -m provision.local_serving stop
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from provision import config
from provision.gpus import count_gpus
from provision.host.layout import RUN_DIR
from provision.host.tritonserver import TritonError, TritonProcess, install
from provision.model_repo import RenderValues, render
from provision.smoke_weights import weight_sources


def render_local_repository(settings: dict | None = None, gpu_count: int | None = None) -> tuple[Path, RenderValues]:
    """Render model_repository/ for this machine into RUNTIME_DIR/models."""
    settings = settings or config.settings()
    food11, blip = weight_sources(settings)
    values = RenderValues.from_settings(count_gpus() if gpu_count is None else gpu_count, food11, blip, settings)
    destination = config.runtime_dir(settings) / "models"
    render(destination, values)
    return destination, values


def local_triton(settings: dict | None = None, model_repository: Path | None = None, **overrides) -> TritonProcess:
    """The TritonProcess of the local runtime, ports from the settings."""
    settings = settings or config.settings()
    runtime = config.runtime_dir(settings)
    ports = settings["ports"]
    arguments = dict(
        runtime_root=runtime / "triton",
        model_repository=model_repository or runtime / "models",
        state_dir=runtime / RUN_DIR,
        http_port=ports["triton_http"],
        grpc_port=ports["triton_grpc"],
        metrics_port=ports["triton_metrics"],
    )
    arguments.update(overrides)
    return TritonProcess(**arguments)


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> None:
    settings = config.settings()
    ports = settings["ports"]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime-dir", type=Path, default=config.runtime_dir(settings))
    parser.add_argument(
        "--model-repository",
        type=Path,
        help="a rendered repository (default: render the project's into RUNTIME_DIR/models)",
    )
    parser.add_argument("--http-port", type=int, default=ports["triton_http"])
    parser.add_argument("--grpc-port", type=int, default=ports["triton_grpc"])
    parser.add_argument("--metrics-port", type=int, default=ports["triton_metrics"])
    commands = parser.add_subparsers(dest="command", required=True)
    install_parser = commands.add_parser("install", help="lay out tritonserver for the serving Python")
    install_parser.add_argument("--serving-python", default=sys.executable)
    install_parser.add_argument("--wheel", default=settings["triton_wheel"])
    start_parser = commands.add_parser("start", help="start and wait until every model is READY")
    start_parser.add_argument("--timeout", type=float, default=settings["triton_ready_timeout_s"])
    start_parser.add_argument("--model", action="append", dest="models", help="a model that must be READY")
    commands.add_parser("stop", help="stop the server")
    commands.add_parser("status", help="pid, readiness and model states")
    args = parser.parse_args(argv)
    settings["runtime_dir"] = str(args.runtime_dir)

    def process() -> TritonProcess:
        return local_triton(
            settings,
            model_repository=args.model_repository,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            metrics_port=args.metrics_port,
        )

    try:
        if args.command == "install":
            runtime = install(args.runtime_dir / "triton", args.serving_python, args.wheel)
            print(f"tritonserver 2.51 ready to run: {runtime.tritonserver}")
        elif args.command == "start":
            if args.model_repository is None:  # the project's own repository, rendered for this machine
                repository, values = render_local_repository(settings)
                print(f"rendered {repository} for {values.gpu_count} GPU(s)")
            server = process()
            states = server.start(args.models, args.timeout)
            print(f"tritonserver pid {server.pid()} at {server.url}, log {server.log_file}")
            for model, state in sorted(states.items()):
                print(f"  {model}: {state}")
        elif args.command == "stop":
            print("stopped" if process().stop() else "not running")
        elif args.command == "status":
            server = process()
            print(f"pid: {server.pid() or 'not running'}; ready: {server.is_ready()}")
            for model, state in sorted((server.model_states() or {}).items()):
                print(f"  {model}: {state}")
    except TritonError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()

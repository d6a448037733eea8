"""The local target's serving stack: rendered repository + a real tritonserver.

Shared by `make demo`, the tests and (through Ansible) the pipeline's local
target, so there is one way the local server is assembled.
"""

from __future__ import annotations

from pathlib import Path

from provision import config
from provision.gpus import count_gpus
from provision.local_triton import TritonProcess
from provision.model_repo import RenderValues, render
from provision.smoke_weights import BLIP_FOLDER, FOOD11_FILE


def weight_sources(settings: dict) -> tuple[str, str]:
    """(food11.pth path, BLIP source): the configured ones, else the smoke weights."""
    smoke_dir = config.runtime_dir(settings) / "weights"
    food11 = settings.get("food11_weights") or str(smoke_dir / FOOD11_FILE)
    blip = settings.get("blip_source") or str(smoke_dir / BLIP_FOLDER)
    if not settings.get("food11_weights") and not Path(food11).exists():
        raise FileNotFoundError(f"no Food-11 weights at {food11}: run `make weights` or set lab.food11_weights")
    return food11, blip


def render_local_repository(settings: dict | None = None, gpu_count: int | None = None) -> tuple[Path, RenderValues]:
    """Render model_repository/ for this machine into RUNTIME_DIR/models."""
    settings = settings or config.defaults()
    food11, blip = weight_sources(settings)
    values = RenderValues.from_settings(count_gpus() if gpu_count is None else gpu_count, food11, blip, settings)
    destination = config.runtime_dir(settings) / "models"
    render(destination, values)
    return destination, values


def local_triton(settings: dict | None = None, model_repository: Path | None = None, **overrides) -> TritonProcess:
    """The TritonProcess of the local runtime, ports from the settings."""
    settings = settings or config.defaults()
    runtime = config.runtime_dir(settings)
    ports = settings["ports"]
    arguments = dict(
        runtime_root=runtime / "triton",
        model_repository=model_repository or runtime / "models",
        state_dir=runtime / "run",
        http_port=ports["triton_http"],
        grpc_port=ports["triton_grpc"],
        metrics_port=ports["triton_metrics"],
    )
    arguments.update(overrides)
    return TritonProcess(**arguments)

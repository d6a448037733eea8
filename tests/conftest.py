"""Shared fixtures: smoke weights, a rendered repository and one real tritonserver.

The server is started once per test session (model loading takes ~20 s) on
free ports, with its own state folder, from the runtime that `make test`
installed in .runtime/triton.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from provision import config, smoke_weights
from provision.local_triton import TritonProcess, TritonRuntime
from provision.model_repo import RenderValues, model_names, render

# The model code (food11, serving_common) imports as top-level modules, as in Triton.
sys.path.insert(0, str(config.MODEL_REPOSITORY / "food_classifier" / "1"))

# Limits the test server is rendered with: small enough to exceed cheaply,
# large enough for a 4000x3000 phone photo.
TEST_MAX_PIXELS = 16_000_000
TEST_MAX_ENCODED_BYTES = 8 * 1024 * 1024


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.fixture(scope="session")
def weights_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("weights")
    smoke_weights.generate(directory)
    return directory


@pytest.fixture(scope="session")
def render_values(weights_dir) -> RenderValues:
    return RenderValues(
        gpu_count=0,
        food11_weights_path=str(weights_dir / smoke_weights.FOOD11_FILE),
        blip_source=str(weights_dir / smoke_weights.BLIP_FOLDER),
        max_pixels=TEST_MAX_PIXELS,
        max_encoded_bytes=TEST_MAX_ENCODED_BYTES,
    )


@pytest.fixture(scope="session")
def triton_runtime() -> TritonRuntime:
    runtime = TritonRuntime(config.runtime_dir() / "triton")
    if not runtime.manifest.exists():
        pytest.fail("no Triton runtime in .runtime/triton: run the tests with `make test`")
    return runtime


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory, render_values, triton_runtime):
    """A running tritonserver serving the whole rendered repository."""
    repository = tmp_path_factory.mktemp("repo") / "models"
    render(repository, render_values)
    http_port, grpc_port, metrics_port = free_ports(3)
    server = TritonProcess(
        runtime_root=triton_runtime.root,
        model_repository=repository,
        state_dir=tmp_path_factory.mktemp("triton-run"),
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
    )
    server.start(model_names(), timeout_s=300)
    yield server
    server.stop()

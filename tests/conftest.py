"""Shared fixtures: smoke weights, a rendered repository and one real tritonserver.

The server is started once per test session (model loading takes ~20 s) on
free ports, with its own state folder, from the runtime that `make test`
installed in .runtime/triton.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from support import budget
from support.lab import new_lab
from support.repository import rendered_repository
from support.sshd import start_sshd

from provision import config, smoke_weights
from provision.host.background import free_ports
from provision.host.tritonserver import TritonProcess, TritonRuntime
from provision.model_repo import RenderValues, model_names

# Parallel workers (pytest-xdist: gw0, gw1, ...) draw free ports from disjoint
# ranges below the kernel's ephemeral ones (32768 and up), so no worker and no
# outgoing connection can take a port another worker handed to its servers.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
os.environ.setdefault("LAB_PORT_RANGE", f"{20000 + 3000 * _WORKER}-{20000 + 3000 * _WORKER + 2999}")

# The model code (food11, serving_common) imports as top-level modules, as in Triton.
sys.path.insert(0, str(config.MODEL_REPOSITORY / "food_classifier" / "1"))

# The longest tests first (a docker deployment, then the other deployments, then
# the tritonserver tests), so that on two workers the short ones fill the end
# instead of one long test running alone after everything else. Stable: within
# a tier, the files' own order.
_FIRST_TIERS = ("docker", "deploy", "triton")


def pytest_configure(config):
    """The session's count of expensive operations (support/budget.py): one file, made by the controller
    before pytest-xdist starts its workers, which inherit its name."""
    if budget.COUNTS_VARIABLE not in os.environ and not hasattr(config, "workerinput"):
        folder = Path(config.rootpath) / ".pytest_cache"
        folder.mkdir(exist_ok=True)
        counts = folder / f"lab-test-counts-{os.getpid()}.txt"
        counts.write_text("")
        os.environ[budget.COUNTS_VARIABLE] = str(counts)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """The session's counts against the budget (pyproject.toml): one over it fails the run. pytest's terminal
    summary, which prints them (below), comes after this hook."""
    if hasattr(session.config, "workerinput"):
        return
    path = Path(os.environ.get(budget.COUNTS_VARIABLE, "/nonexistent"))
    lines, over = budget.report(budget.counted(path), budget.budget())
    session.config.lab_budget = (lines, over)
    if over and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if path.parent.name == ".pytest_cache":  # the session's own file (pytest_configure made it)
        path.unlink(missing_ok=True)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not hasattr(config, "lab_budget"):
        return
    lines, over = config.lab_budget
    terminalreporter.write_sep("-", "expensive operations (pyproject.toml [tool.lab.test_budget])")
    for line in lines:
        terminalreporter.write_line(line)
    for line in over:
        terminalreporter.write_line(f"OVER THE BUDGET: {line}: raise it in pyproject.toml, saying why", red=True)


def pytest_unconfigure(config):
    """The kinds over the budget again, after pytest's last line: the tail of a long run's log says why it failed."""
    for line in getattr(config, "lab_budget", ([], []))[1]:
        print(f"make test failed on its budget of expensive operations: {line} (pyproject.toml)", file=sys.stderr)


def pytest_collection_modifyitems(items):
    def tier(item) -> int:
        return next((n for n, mark in enumerate(_FIRST_TIERS) if item.get_closest_marker(mark)), len(_FIRST_TIERS))

    items.sort(key=tier)


# Limits the test server is rendered with: small enough to exceed cheaply,
# large enough for a 4000x3000 phone photo.
TEST_MAX_PIXELS = 16_000_000
TEST_MAX_ENCODED_BYTES = 8 * 1024 * 1024


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
        reduced_decoding=True,  # the fast path (the default): served and in-process must agree on it too
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
    repository = rendered_repository(tmp_path_factory.mktemp("repo"), render_values)
    server = TritonProcess.on_free_ports(triton_runtime.root, repository, tmp_path_factory.mktemp("triton-run"))
    server.start(model_names(), timeout_s=300)
    yield server
    server.stop()


# ---- the pipeline: isolated users of `fab`, and an SSH host

@pytest.fixture
def lab(tmp_path):
    """A Lab that is torn down even when the test fails half-way."""
    user = new_lab(tmp_path)
    yield user
    if user.state() is not None:
        user.fab("teardown", "--purge", check=False)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """A real sshd on 127.0.0.1 (own config, host key and authorized key)."""
    server = start_sshd(tmp_path_factory.mktemp("sshd"), free_ports(1)[0])
    yield server
    server.stop()

"""Triton model-serving experiments: fab provision -> deploy -> bench -> teardown.

Defaults live in fabric.yaml (section `lab`); override them in ~/.fabric.yaml,
with FABRIC_LAB_* environment variables, or with the tasks' flags.
Each task is a thin layer over the `provision` package, whose modules are the
pipeline's stages.
"""

from __future__ import annotations

from invoke import Exit, task

from provision import inventory, targets
from provision import state as state_module


def _settings(c) -> dict:
    """The `lab` configuration as plain dicts (Invoke hands out DataProxy objects)."""

    def plain(value):
        if hasattr(value, "items"):
            return {key: plain(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(item) for item in value]
        return value

    return plain(c.config.lab)


def _state():
    try:
        return state_module.require()
    except state_module.StateError as error:
        raise Exit(f"error: {error}") from None


@task(
    iterable=["host"],
    help={
        "target": "local (this machine, the default), ssh (your hosts) or chameleon (a P100 node)",
        "host": "ssh target: a host name or address (repeat or comma-separate for several)",
        "user": "ssh target: login user (default: your user name)",
        "port": "ssh target: SSH port (default 22)",
        "key": "ssh target: private key file",
        "python": "ssh target: the host's Python for Ansible (default: discovered)",
        "serving_venv": "reuse this existing virtualenv on the host for serving (default: create one)",
    },
)
def provision(c, target="", host=None, user="", port=22, key="", python="", serving_venv=""):
    """Reserve or record the hosts to serve on, and render inventory/hosts.yml."""
    settings = _settings(c)
    target = target or settings["target"]
    try:
        module = targets.get(target)
    except targets.UnknownTarget as error:
        raise Exit(f"error: {error}") from None
    current = state_module.load()
    if current is not None and current.target != target:
        raise Exit(
            f"error: already provisioned on the {current.target} target: run `fab teardown` first, "
            f"then `fab provision --target {target}`"
        )
    options = {"hosts": host, "user": user, "port": port, "key": key, "python": python, "serving_venv": serving_venv}
    try:
        new_state = module.provision(settings, options, current, state_module.save, print)
    except (ValueError, RuntimeError) as error:
        raise Exit(f"error: {error}") from None
    print(f"inventory: {inventory.render(new_state)}")
    print("next: fab deploy")


@task
def deploy(c):
    """Set up the hosts and start Triton and the API (a second run changes nothing)."""
    from provision.ansible import PlaybookError
    from provision.deploy import deploy as run_deploy

    state = _state()
    try:
        result = run_deploy(_settings(c), state, print)
    except (PlaybookError, FileNotFoundError) as error:
        raise Exit(f"error: {error}\n\nfix it and run `fab deploy` again (it continues where it stopped)") from None
    changes = result.total_changed
    print(f"deploy complete: {changes} change(s)" if changes else "deploy complete: no changes")
    print(f"log: {result.log}")
    print("next: fab bench (or fab status)")


@task(
    iterable=["model"],
    help={"quick": "short measurements (a smoke run)", "model": "benchmark only this model (repeatable)"},
)
def bench(c, quick=False, model=None):
    """Run perf_analyzer over the models; write tables, plots and a report to results/<run-id>/."""
    from provision.ansible import PlaybookError
    from provision.bench import BenchError
    from provision.bench import bench as run_bench

    state = _state()
    try:
        results = run_bench(_settings(c), state, models=model or None, quick=quick, say=print)
    except (BenchError, PlaybookError) as error:
        raise Exit(f"error: {error}") from None
    print(f"results: {results}")
    print(f"report: {results / 'report.md'}")


@task(help={"purge": "forget the local state even if cleaning the hosts or the cloud fails"})
def teardown(c, purge=False):
    """Stop everything, remove what deploy installed, release cloud resources, verify, clear the state."""
    from provision.teardown import TeardownError
    from provision.teardown import teardown as run_teardown

    try:
        run_teardown(_settings(c), state_module.load(), print, purge=purge)
    except TeardownError as error:
        raise Exit(f"error: {error}") from None


@task
def status(c):
    """Show the target, the hosts, each service's health, the models' states and the URLs."""
    from provision.status import describe

    for line in describe(_state()):
        print(line)


@task(help={"service": "triton or api", "lines": "how many lines (default 50)"})
def logs(c, service="triton", lines=50):
    """Show the recent log of a service on every host."""
    from provision.status import logs as read_logs

    try:
        output = read_logs(_state(), service, lines)
    except ValueError as error:
        raise Exit(f"error: {error}") from None
    for host, text in output.items():
        print(f"==> {host}: {service} <==")
        print(text.rstrip())

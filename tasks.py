"""Triton model-serving experiments: fab provision -> deploy -> bench -> teardown.

The `lab` settings: defaults in provision/defaults.yaml, under ~/.fabric.yaml,
the project's fabric.yaml, FABRIC_LAB_* variables, `fab -f FILE` and the
tasks' flags, each beating the one before (provision/config.py; `fab config`
shows them). Code that runs without Fabric gets the same merge from
provision.config.settings().
Each task is a thin layer over the `provision` package, whose modules are the
pipeline's stages.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from pathlib import Path

from invoke import Collection, Exit, Task
from invoke import task as invoke_task
from invoke.exceptions import ParseError
from invoke.parser import Argument

from provision import config, flags, hosts, interrupts, inventory, lock, path_settings, pipeline, targets
from provision import state as state_module
from provision.ansible import PlaybookError, PlaybookInterrupted
from provision.errors import LabError, UsageError
from provision.measure import results_root
from provision.model_repo import NOT_BENCHMARKED, benchmarked_models, read_tuned
from provision.pipeline import INTERRUPTED
from provision.tune import VALUES

compare_runs = config.client_script("compare_runs")


def _number_kind(parameter: inspect.Parameter) -> type | None:
    """int or float: a flag's number type, from its default (22, 0.1) or, where the default is None
    (not given), from its annotation ("int | None"); None for any other flag."""
    if type(parameter.default) in (int, float):
        return type(parameter.default)
    if parameter.default is None and parameter.annotation is not inspect.Parameter.empty:
        return next((kind for kind in (int, float) if kind.__name__ in str(parameter.annotation)), None)
    return None


class _NumberFlag(Argument):
    """A number flag: a value that is not one is Invoke's ParseError (one line, exit 1), not a traceback."""

    def set_value(self, value, cast=True):
        try:
            super().set_value(value, cast)
        except ValueError:
            raise ParseError(f"error: --{self.names[0]} {value}: give {'a whole number' if self.kind is int else 'a number'}") from None


class LabTask(Task):
    """A task whose number flags are numbers or stop as one line naming the flag (Invoke casts a flag
    to its default's type while parsing, where `--repeats abc` ended in a ValueError's traceback).
    A flag whose default is None (not given) takes its type from its annotation. The body checks ranges."""

    @functools.cached_property
    def _parameters(self):
        return inspect.signature(self.body).parameters

    def arg_opts(self, name, default, taken_names):
        opts = super().arg_opts(name, default, taken_names)
        kind = _number_kind(self._parameters[name])
        if kind:
            opts["kind"] = kind
        return opts

    def get_arguments(self, ignore_unknown_help=None):
        arguments = super().get_arguments(ignore_unknown_help)
        for argument in arguments:
            if argument.kind in (int, float):
                argument.__class__ = _NumberFlag
        return arguments


def task(*args, **kwargs):
    """Invoke's @task, making LabTasks."""
    if len(args) == 1 and callable(args[0]) and not kwargs:  # bare @task
        return invoke_task(klass=LabTask)(args[0])
    return invoke_task(*args, klass=LabTask, **kwargs)


def _settings(c, strict: bool = True) -> dict:
    """The `lab` settings as Invoke merged them: the defaults (this collection's configuration, below
    every file), ~/.fabric.yaml, the project's fabric.yaml, FABRIC_LAB_*, `fab -f` (provision/config.py).
    strict False: a value of the wrong type is a warning, not an error (teardown: a bad setting must not
    keep what was provisioned running)."""
    return config.settings(c.config.lab, runtime_path=getattr(c.config, "_runtime_path", None), strict=strict)


def _state():
    """The recorded state; a StateError (nothing provisioned) becomes the task's clean failure."""
    return state_module.require()


def _fails_cleanly(again: str = "", interrupted: str = "", again_after: tuple[type[Exception], ...] = (PlaybookError,)):
    """The one place where errors become a clean `Exit`, so that each task body is its happy path.

    A LabError (provision/errors.py: every error meant for the user) exits 1 with
    "error: <message>", followed by `again` (what to do next) when it is one of
    `again_after` (the work had started: the playbook ran); a playbook that
    Ctrl-C or SIGTERM cancelled exits 130 with its message and `interrupted`.
    Anything else is a bug, and shows its traceback.
    """

    def decorate(body):
        @functools.wraps(body)  # Invoke reads the task's parameters through the wrapper
        def task_body(*args, **kwargs):
            try:
                return body(*args, **kwargs)
            except PlaybookInterrupted as error:
                raise Exit(f"{error}{interrupted}", code=INTERRUPTED) from None
            except LabError as error:
                raise Exit(f"error: {error}{again if isinstance(error, again_after) else ''}") from None

        return task_body

    return decorate


def _one_at_a_time(body):
    """The task holds the state's lock while it works (provision.lock): a second command waits, or with
    --no-wait refuses at once. Within `fab run`, the stages it calls hold the run's lock."""

    @functools.wraps(body)
    def locked(c, *args, **kwargs):
        say = functools.partial(print, file=sys.stderr, flush=True)
        with lock.held(body.__name__, wait=not kwargs.get("no_wait", False), say=say):
            return body(c, *args, **kwargs)

    return locked


# The flag of every task that takes the lock.
NO_WAIT_HELP = {"no_wait": "refuse at once when another fab command works on this state (default: wait for it)"}

# The flags of `fab deploy` that make a cluster, which `fab run` takes too.
CLUSTER_HELP = {
    "cluster": "serve the hosts behind one load balancer (HAProxy on the first host; a deployed cluster stays one)",
    "lb_node": "with --cluster: a host (name or index) of its own for the balancer and the bench's clients "
    "(not a backend; without it the first host serves and balances)",
}

# The defaults the chameleon flags' help names, from the settings' one place (provision/defaults.yaml).
_CHAMELEON = config.defaults()["chameleon"]

# The flags of `fab provision`, which `fab run` takes too.
PROVISION_HELP = {
    "target": "local (this machine, the default), ssh (your hosts) or chameleon (a P100 node)",
    "host": "ssh target: a host name or address (repeat or comma-separate for several)",
    "user": "ssh and chameleon targets: login user (ssh: your user name; chameleon: lab.chameleon.ssh_user, "
    f"{_CHAMELEON['ssh_user']})",
    "port": "ssh target: SSH port (default 22)",
    "key": "ssh and chameleon targets: private key file",
    "python": "ssh and chameleon targets: the host's Python for Ansible (default: discovered)",
    "serving_venv": "reuse this existing virtualenv on the host for serving (default: create one)",
    "runtime": "process (services from a virtualenv) or docker (containers on GPU hosts; the chameleon default)",
    "site": f"chameleon: site (default lab.chameleon.site, {_CHAMELEON['site']})",
    "node_type": f"chameleon: node type (default lab.chameleon.node_type, {_CHAMELEON['node_type']})",
    "image": f"chameleon: image (default lab.chameleon.image, {_CHAMELEON['image']})",
    "hours": f"chameleon: lease length in hours (default lab.chameleon.lease_hours, {_CHAMELEON['lease_hours']})",
    "count": f"chameleon: number of nodes (default lab.chameleon.node_count, {_CHAMELEON['node_count']})",
    "floating_ip": "chameleon: reserved (reserved with the lease, the default) or adhoc (allocated apart: "
    "when the lease's pool has none left)",
    "key_name": "chameleon: key pair name (default derived from your user; uploaded if missing)",
    "public_key": f"chameleon: public key to upload (default lab.chameleon.public_key, {_CHAMELEON['public_key']})",
    "lease": "chameleon: a lease you hold (name or id, made in the dashboard or the CLI): launch on it, "
    "take its node type and count; teardown leaves it",
    "start": 'chameleon: book the lease ahead, from "YYYY-MM-DD HH:MM" (your time zone) or "earliest" (the next '
    "free slot); provision returns once it is booked (fab run waits for its start)",
    "node": "chameleon: reserve this node by name (repeat for several, one host each; the Host Calendar names them)",
    "resource_property": "chameleon: reserve only nodes with KEY=VALUE (repeatable; Blazar's $KEY == VALUE)",
}


@task(
    iterable=["host", "node", "resource_property"],
    help={
        **PROVISION_HELP,
        "wait_for_start": "chameleon: wait for a lease booked ahead to start, then launch (what fab run does)",
        **NO_WAIT_HELP,
    },
    auto_shortflags=False,  # with them, --host took -h, and `fab provision -h` provisioned instead of helping
)
@_fails_cleanly()
@_one_at_a_time
def provision(
    c,
    target="", runtime="", serving_venv="",
    # the ssh target's hosts and how to reach them (user, key and python: chameleon's too)
    host=None, user="", port=22, key="", python="",
    # the chameleon target's
    site="", node_type="", image="", hours: float | None = None, count: int | None = None, key_name="", public_key="",
    floating_ip="",
    lease="", start="", wait_for_start=False, node=None, resource_property=None,
    no_wait=False,
):  # fmt: skip
    """Reserve or record the hosts to serve on, and render inventory/hosts.yml.

    Chameleon reads your credentials from the environment (source the
    OpenStack RC file of your project first); none of them is stored.
    """
    given = {  # the flags given: not their default, not empty
        name: value for name, value in locals().items()
        if name in PROVISION_DEFAULTS and value != PROVISION_DEFAULTS[name] and value not in (None, "", [])
    }  # fmt: skip
    settings = _settings(c)
    target = target or settings["target"]
    targets.get(target)  # an unknown name fails here, naming the choices
    readers = {name: targets.provision_flags(name) for name in targets.TARGETS}
    flags.for_target(target, given, readers, targets.COMMON_PROVISION_FLAGS)
    current = state_module.load()
    targets.check_can_provision(target, current)
    options = {
        "hosts": host, "user": user, "port": port, "key": key, "python": python, "serving_venv": serving_venv,
        "runtime": runtime,
        "site": site, "node_type": node_type, "image": image, "hours": hours, "count": count,
        "key_name": key_name, "public_key": public_key, "private_key": key, "floating_ip": floating_ip,
        "lease": lease, "start": start, "wait_for_start": wait_for_start, "node": node or [],
        "resource_property": resource_property or [],
    }  # fmt: skip
    # Ctrl-C or SIGTERM (a closed terminal, a batch scheduler) ends a provision where it is.
    try:
        with interrupts.handled():
            new_state = targets.provision(target, settings, options, current, state_module.save, print)
    except Exception:
        targets.forget_a_state_that_holds_nothing()
        raise  # and _fails_cleanly says why (or shows a bug's traceback)
    except KeyboardInterrupt:
        raise Exit(targets.interrupted_provision(target), code=INTERRUPTED) from None
    if not new_state.hosts:  # a reservation booked ahead: the target said when it starts and what to run then
        return
    print(f"inventory: {inventory.render(new_state)}")
    print("next: fab deploy")


# Each flag of `fab provision` with its default: a flag whose value differs was given.
PROVISION_DEFAULTS = {
    name: parameter.default for name, parameter in inspect.signature(provision.body).parameters.items() if name != "c"
}


@task(
    help={
        "check": "dry run (Ansible check mode): show what would change, change nothing",
        "publish": "listen on every address of the hosts, not 127.0.0.1, and open the ports in firewalld "
        "where it runs (to the internet, on Chameleon)",
        "models_from": "a best.json of `fab tune` (results/<run-id>/tune/best.json): deploy its model settings",
        **CLUSTER_HELP,
        **NO_WAIT_HELP,
    }
)
@_fails_cleanly(
    again="\n\nfix it and run `fab deploy` again (it continues where it stopped)",
    interrupted="\n`fab deploy` continues where it stopped",
)
@_one_at_a_time
def deploy(c, check=False, publish=False, models_from="", cluster=False, lb_node="", no_wait=False):
    """Set up the hosts and start Triton and the API (a second run changes nothing)."""
    from provision.deploy import deploy as run_deploy

    state = _state()
    targets.check_hosts_to_deploy(state)  # a reservation booked ahead: its hosts come once it has started
    if not state.hosts:
        print(f"no host yet: launching on the {state.target} reservation first (fab provision)")
        provision(c, target=state.target)
        state = _state()
    settings = _settings(c)
    if models_from:
        tuned = read_tuned(models_from)
        settings["models"]["tuned"] = {**settings["models"].get("tuned", {}), **tuned}
        print(f"model settings from {models_from}: " + "; ".join(f"{m} {s}" for m, s in tuned.items()))
    if publish:
        settings["bind_address"] = "0.0.0.0"
        print("warning: --publish: the services (in a cluster, its balancer) listen on every address of their host, "
              "and where firewalld runs (Chameleon's images) deploy opens their ports to everyone: Chameleon's bare "
              "metal has no security groups, so anyone on the internet can reach them; `fab teardown` closes them, "
              "and so does a `fab deploy` without --publish")  # fmt: skip
    result = run_deploy(settings, state, print, check=check, cluster=cluster, balancer=lb_node)
    if check:
        print(f"check mode: {result.total_changed} change(s) would be made; nothing was changed")
        return
    changes = result.total_changed
    print(f"deploy complete: {changes} change(s)" if changes else "deploy complete: no changes")
    if len(result.seconds) > 1:  # several hosts, configured side by side: how long each took
        for name, seconds in sorted(result.seconds.items()):
            print(f"  {name}: {result.changed.get(name, 0)} change(s), done after {seconds:.0f} s")
    print(f"log: {result.log}")
    print("next: fab bench (or fab status)")


@task(
    iterable=["model"],
    help={
        "quick": "short measurements (a smoke run)",
        "model": "benchmark only this model (repeatable)",
        "cluster": "a deployed cluster: each node alone, then the cluster through its balancer; report's Cluster section",
        "scenario": "closed_loop (the default: each client sends its next request once answered, at each "
        "concurrency) or server (Poisson arrivals: the highest rate whose p99 stays within --p99-ms)",
        "p99_ms": "with --scenario server: the p99 bound in milliseconds (rates searched: the profile's "
        "request_rate_range)",
        **NO_WAIT_HELP,
    },
)
@_fails_cleanly()
@_one_at_a_time
def bench(c, quick=False, model=None, cluster=False, scenario="closed_loop", p99_ms: float | None = None, no_wait=False):
    """Run perf_analyzer over the models; write tables, plots and a report to results/<run-id>/."""
    from provision.bench import bench as run_bench
    from provision.bench import scenario_bound

    flags.models(model or [], benchmarked_models(), not_offered=NOT_BENCHMARKED)
    bound = scenario_bound(scenario, flags.positive_number(p99_ms, "--p99-ms", "milliseconds") if p99_ms is not None else 0)
    settings = _settings(c)
    path_settings.check_results(settings)
    results = run_bench(
        settings, _state(), models=model or None, quick=quick, say=print, cluster=cluster, server_p99_ms=bound
    )
    print(f"results: {results}")
    print(f"report: {results / 'report.md'}")
    return results


@task(
    help={
        "model": "the model to tune, e.g. batching_food_classifier",
        "p99_ms": "latency budget: p99 in milliseconds at the chosen concurrency",
        "quick": "fewer values per setting and short measurements (a few minutes on a small machine)",
        "max_gpus": "use at most this many of the host's GPUs (default: all)",
        "concurrency": "perf_analyzer's --concurrency-range start:end:step (default: the bench profile's)",
        "batch_sizes": "max_batch_size values to try, comma-separated (default "
        + "; quick ".join(",".join(map(str, VALUES[p]["max_batch_size"])) for p in ("full", "quick"))
        + ")",
        "scenario": "closed_loop (the default: a candidate is worth its most throughput at a concurrency within the "
        "budget) or server (its highest Poisson arrival rate within it: fab bench --scenario server)",
        "repeats": "measure each candidate this many times, back to back; its figure is their median "
        f"(default lab.tune.repeats: {config.defaults()['tune']['repeats']})",
        **NO_WAIT_HELP,
    }
)
@_fails_cleanly()
@_one_at_a_time
def tune(
    c,
    model="",
    p99_ms="",
    quick=False,
    max_gpus: int | None = None,
    concurrency="",
    batch_sizes="",
    scenario="closed_loop",
    repeats: int | None = None,
    no_wait=False,
):
    """Find the model's serving settings with the most throughput under a p99 budget, on the deployed host.

    Candidates are rendered from the model's template and loaded into the
    running Triton one at a time; the deployed configuration is put back at
    the end. Writes results/<run-id>/tune/ (candidates.csv, best.json,
    pareto.png) and report.md; `fab deploy --models-from .../tune/best.json`
    deploys the winner.
    """
    from provision.bench import check_scenario
    from provision.tune import tune as run_tune

    if not model:
        raise flags.FlagError("--model is required: the model to tune, e.g. --model batching_food_classifier")
    if p99_ms == "":
        raise flags.FlagError("--p99-ms is required: the latency budget, a p99 in milliseconds, e.g. --p99-ms 100")
    flags.models([model], benchmarked_models(), not_offered=NOT_BENCHMARKED)
    budget = flags.positive_number(p99_ms, "--p99-ms", "milliseconds")
    concurrency = flags.concurrency_range(concurrency) if concurrency else ""
    sizes = flags.positive_integers(batch_sizes, "--batch-sizes") if batch_sizes else None
    gpus = flags.whole_number(max_gpus, "--max-gpus", 1, "GPUs") if max_gpus is not None else None
    server = check_scenario(scenario) == "server"
    count = flags.whole_number(repeats, "--repeats", 1, "measurements") if repeats is not None else 0
    settings = _settings(c)
    path_settings.check_results(settings)
    try:
        # SIGTERM too becomes KeyboardInterrupt: the tune puts the deployed configuration back either way.
        with interrupts.handled():
            results = run_tune(
                settings, _state(), model, budget, quick=quick, max_gpus=gpus,
                concurrency=concurrency, batch_sizes=sizes, say=lambda line: print(line, flush=True),  # live, also piped
                server=server, repeats=count,
            )  # fmt: skip
    except KeyboardInterrupt:
        raise Exit("fab tune interrupted; the deployed configuration is back", code=INTERRUPTED) from None
    print(f"results: {results / 'tune'}")
    print(f"report: {results / 'report.md'}")
    return results


def _and_provision_flags(body):
    """The task takes `fab provision`'s flags too (but its --wait-for-start and --no-wait): they come in
    **provision_flags, and the signature that Invoke reads names each of them with its default."""
    own = inspect.signature(body)
    taken = [parameter for parameter in own.parameters.values() if parameter.kind is not parameter.VAR_KEYWORD]
    names = {parameter.name for parameter in taken}
    borrowed = [
        parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for name, parameter in inspect.signature(provision.body).parameters.items()
        if name in PROVISION_HELP and name not in names
    ]
    first, rest = taken[:1], [parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY) for parameter in taken[1:]]
    body.__signature__ = own.replace(parameters=[*first, *borrowed, *rest])
    return body


@task(
    iterable=["host", "node", "resource_property", "model"],
    help={
        **PROVISION_HELP,
        "quick": "short measurements (a smoke run)",
        "model": "benchmark only this model (repeatable)",
        "keep": "leave the deployment running afterwards (no teardown)",
        "release_lease": "chameleon: the teardown deletes a lease you brought (--lease) too; a Ctrl-C while "
        "waiting for a lease this run booked (--start) deletes it, instead of leaving it booked",
        **CLUSTER_HELP,
        "cluster": "deploy the hosts behind one load balancer and bench them as one (fab deploy/bench --cluster)",
        **NO_WAIT_HELP,
    },
    auto_shortflags=False,  # with them, --host took -h: `fab run -h` ran the whole pipeline instead of helping
)
@_fails_cleanly()
@_one_at_a_time
@_and_provision_flags
def run(
    c,
    release_lease=False,
    quick=False,
    model=None,
    keep=False,
    cluster=False,
    lb_node="",
    no_wait=False,
    **provision_flags,
):
    """provision -> deploy -> bench -> teardown in one command; teardown runs after a failure or Ctrl-C too.

    Unless --keep, teardown runs however the other stages end: success, an
    error, Ctrl-C or SIGTERM (a second Ctrl-C during teardown is refused: it
    finishes). The exit code is non-zero when a stage failed, and the last
    lines name it. A bench that did not finish leaves its folder marked partial.
    """
    sys.stdout, sys.stderr = _PipeSafe(sys.stdout), _PipeSafe(sys.stderr)
    targets.check_nothing_provisioned(state_module.load())
    # The user's own paths, before anything is made: a missing weights file is not a failed deploy.
    settings = _settings(c)
    path_settings.check_weights(settings)
    path_settings.check_results(settings)
    stages = {
        "provision": lambda: provision(c, **provision_flags, wait_for_start=True),  # a lease booked ahead
        "deploy": lambda: deploy(c, cluster=cluster, lb_node=lb_node),
        "bench": lambda: bench(c, quick=quick, model=model, cluster=cluster),
    }
    ending = pipeline.run(
        stages,
        teardown=lambda: teardown(c, release_lease=release_lease),
        settings=_settings(c),
        keep=keep,
        release_lease=release_lease,
        say=lambda line: print(line, flush=True),
    )
    if ending.failed:
        raise Exit(f"fab run: stage {ending.failed} failed (exit {ending.code}); its message is above", code=ending.code)
    if ending.code:
        raise Exit(code=ending.code)


class _PipeSafe:
    """A text stream whose reader may go away (`fab run | head`, a closed terminal): its output then
    goes nowhere, and the writer goes on. fab run's teardown must not die of a broken pipe."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:  # BrokenPipeError, EIO of a closed terminal
            self._stream = open(os.devnull, "w")  # noqa: SIM115 (kept for the rest of the process)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            self._stream = open(os.devnull, "w")  # noqa: SIM115

    def __getattr__(self, name):
        return getattr(self._stream, name)


@task(
    help={
        "purge": "forget the local state even if cleaning the hosts or the cloud fails",
        "release_lease": "chameleon: delete a lease you brought with provision --lease too (it is left otherwise)",
        **NO_WAIT_HELP,
    }
)
@_fails_cleanly()
@_one_at_a_time
def teardown(c, purge=False, release_lease=False, no_wait=False):
    """Stop everything, remove what deploy installed, release cloud resources, verify, clear the state."""
    from provision.teardown import teardown as run_teardown

    run_teardown(_settings(c, strict=False), state_module.load(), print, purge=purge, release_lease=release_lease)


@task
@_fails_cleanly()
def status(c):
    """Show the target, the hosts, each service's health, the models' states and the URLs."""
    from provision.status import describe

    state = _state()
    for line in targets.status_lines(state.target, state, _settings(c)):
        print(line)
    for line in describe(state):
        print(line)


@task(help={"hours": "hours to add to the lease", **NO_WAIT_HELP}, auto_shortflags=False)  # --hours took -h
@_fails_cleanly()
@_one_at_a_time
def extend(c, hours=1, no_wait=False):
    """Chameleon: extend the lease by N hours (possible within 48 h of its end)."""
    hours = flags.whole_number(hours, "--hours", 1, "hours")
    state = _state()
    targets.extend(state.target, state, _settings(c), hours, state_module.save, print)


@task(help={"node": "which host (name or index, default the first)"})
@_fails_cleanly()
def ssh(c, node="0"):
    """Open a shell on a provisioned host."""
    chosen = hosts.select(_state().hosts, node)
    if hosts.is_this_machine(chosen):
        raise Exit(f"error: {hosts.THIS_MACHINE}: no SSH needed")
    os.execvp("ssh", hosts.ssh_client_command(chosen))


@task(
    help={
        "node": "which host (name or index, default the first)",
        "offset": "local port = the host's port + N (default 0); use it when those ports are taken here",
    }
)
@_fails_cleanly()
def tunnel(c, node="0", offset=0):
    """Forward the host's Triton, API and Jupyter to 127.0.0.1 here over SSH; print their URLs; Ctrl-C closes it."""
    from provision.tunnel import run as run_tunnel

    offset = flags.whole_number(offset, "--offset", 0)
    run_tunnel(_state(), node=node, offset=offset, say=lambda line: print(line, flush=True))


@task(help={"service": "triton, api or jupyter", "lines": "how many lines (default 50)"})
@_fails_cleanly()
def logs(c, service="triton", lines=50):
    """Show the recent log of a service on every host."""
    from provision.status import logs as read_logs

    lines = flags.whole_number(lines, "--lines", 1)
    output = read_logs(_state(), service, lines)
    for host, text in output.items():
        print(f"==> {host}: {service} <==")
        print(text.rstrip())


@task(
    positional=["run_a", "run_b"],
    iterable=["also"],
    help={
        "run_a": "the baseline run: a results/<run-id>/ folder or its run id",
        "run_b": "the run to compare with it",
        "also": "one more run to compare (repeatable)",
        "threshold": "flag a regression beyond this fraction (default 0.10: the full profile's noise)",
        "out": "where to write compare.md and compare.png (default results/compare/<A>_vs_<B>...)",
        "fail_on_regression": "exit 1 when a regression is flagged (for CI)",
    },
)
@_fails_cleanly()
def compare(c, run_a, run_b, also=None, threshold=0.10, out="", fail_on_regression=False):
    """Two or more bench runs side by side: what differs, throughput and p95/p99 with ratios, regressions."""
    from pathlib import Path

    if threshold < 0:
        raise flags.FlagError(f"--threshold {threshold:g}: give a fraction of at least 0 (0.10: 10 %)")
    root = results_root(_settings(c))
    paths = [Path(run) if Path(run).exists() else root / run for run in [run_a, run_b, *(also or [])]]
    try:
        runs = compare_runs.load_runs(paths)
    except compare_runs.CompareError as error:  # client_scripts/ import nothing of ours: theirs becomes a LabError
        raise UsageError(str(error)) from None
    folder = Path(out) if out else root / "compare" / "_vs_".join(run["run_id"] for run in runs)
    written = compare_runs.write(runs, folder, float(threshold))
    differing = list(compare_runs.differing_facts(runs)) + [
        f"deployed config {name}" for name in compare_runs.config_diffs(runs)
    ]
    print(f"compared {len(runs)} runs over {len(written['rows'])} model/concurrency pair(s)")
    print(
        "differ in: "
        + ("; ".join(differing) if differing else "nothing: the same commit, versions, hardware and deployed configs")
    )
    quick = compare_runs.quick_runs(runs)
    indicative = f" (indicative: {', '.join(quick)} used the quick profile)" if quick else ""
    for measurement in written["busy"]:
        print(
            f"BUSY HOST {measurement['run']}: {measurement['model']} on {measurement['host']} measured under "
            f"{compare_runs.run_folder.load_words(measurement['load'])}: its figures may be low"
        )
    parts = {(c["run"], c["model"], c["concurrency"]): c for c in written["split_changes"]}
    for found in written["regressions"]:
        part = parts.get((found["run"], found["model"], found["concurrency"]))
        grew = (
            f"; the average mostly in {part['part'].replace('_', ' ')} ({part['change_us'] / 1000:+.1f} ms)"
            if part
            else ""
        )
        print(
            f"REGRESSION {found['run']}: {found['model']} c={found['concurrency']} {found['figure']} "
            f"x{found['ratio']:.2f}{grew}{' (measured on a busy host: may be the load)' if found['busy_host'] else ''}"
            f"{indicative}"
        )
    print(f"report: {folder / 'compare.md'}")
    if fail_on_regression and written["regressions"]:
        raise Exit(f"{len(written['regressions'])} regression(s) beyond {float(threshold):.0%}", code=1)


@task(
    positional=["line"],
    help={
        "line": "perf_analyzer's command line as you would type it, quoted: \"perf_analyzer -m food_classifier "
        '--input-data input.json -b 1 --concurrency-range 8" (-u is set to the deployed Triton; a local '
        "--input-data file is copied to the host)",
        "node": "which host (name or index, default the first)",
    },
)
@_fails_cleanly()
def perf(c, line, node="0"):
    """Run perf_analyzer by hand on a deployed host, where fab bench runs it (the course's commands work as typed)."""
    from provision.perf_by_hand import run as run_perf

    code = run_perf(_state(), line, node, say=lambda text: print(text, flush=True))
    if code:
        raise Exit(f"perf_analyzer exited {code}", code=code)


@task(name="config")
@_fails_cleanly()
def show_config(c):
    """Print the merged `lab` settings, and where each value that differs from its default came from."""
    merged = _settings(c)
    found = config.levels(Path(__file__).resolve().parent, getattr(c.config, "_runtime_path", None))
    for line in config.explain(merged, found):
        print(line)
    chosen = "<- LAB_STATE_FILE" if os.environ.get("LAB_STATE_FILE") else "(the default; LAB_STATE_FILE moves it)"
    print(f"state file: {state_module.state_file()}    {chosen}")


def help_asked_of_a_positional_task(argv: list[str]) -> list[str] | None:
    """`fab ... TASK -h|--help` for a task with positional arguments (compare, perf), as the command line
    that shows its help (`fab ... --help TASK`); None for any other command line."""
    positional = {name for name, body in ns.tasks.items() if body.positional}
    for at, word in enumerate(argv[:-1]):
        if word in positional and argv[at + 1] in ("-h", "--help"):
            return [*argv[:at], "--help", word]
    return None


# The tasks, with the `lab` defaults as their collection's configuration: Invoke ranks that below
# ~/.fabric.yaml, the project's fabric.yaml, FABRIC_LAB_* and `fab -f` (provision/config.py).
ns = Collection.from_module(sys.modules[__name__])
ns.configure({"lab": config.defaults()})

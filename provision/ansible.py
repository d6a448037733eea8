"""Run a playbook of playbooks/ through ansible-runner, with one progress line per task.

On failure the error names the failing task and host, Ansible's message, and
the full log of the run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from provision import interrupts, lock
from provision.config import PROJECT_ROOT
from provision.errors import OperationError
from provision.host.background import PLAYBOOK_RUN_VARIABLE, end
from provision.inventory import inventory_file
from provision.state import state_file

PLAYBOOKS = PROJECT_ROOT / "playbooks"

# Tasks whose `msg` the caller wants back (set by the playbooks with ansible.builtin.debug).
REPORT_TASK_PREFIX = "Report "
# A rescue's last task, which fails the host again after the failure it rescued (whose message is
# already shown): it adds no message of its own (playbooks/tasks/explain_failure.yml).
REFAIL_TASK = "Stop at the failure above"


class PlaybookError(OperationError):
    """A playbook failed; str() says where and why, `failures` each failed task's (task, host, message)."""

    def __init__(self, message: str, failures: list[tuple[str, str, str]] | None = None):
        super().__init__(message)
        self.failures = failures or []

    def message_of(self, task: str) -> str | None:
        """The message of the first failure of `task`, or None when that task did not fail."""
        return next((text for name, _, text in self.failures if name == task), None)


class PlaybookInterrupted(PlaybookError):
    """Ctrl-C or SIGTERM cancelled the playbook (ansible-runner stops it cleanly)."""


@dataclass
class PlaybookResult:
    playbook: str
    changed: dict[str, int] = field(default_factory=dict)  # host -> changed task count
    ok: dict[str, int] = field(default_factory=dict)
    reports: dict[str, dict] = field(default_factory=dict)  # host -> {report task: msg}
    log: Path | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # host -> from the start to its last task's end

    @property
    def total_changed(self) -> int:
        return sum(self.changed.values())


def _failure_text(result: dict) -> str:
    """The most useful part of a failed task's result."""
    if result.get("results"):  # a loop: the failed items say more than "One or more items failed"
        failed = [item for item in result["results"] if item.get("failed")]
        if failed:
            return "\n".join(
                f"({item.get('_ansible_item_label', item.get('item'))}) {_failure_text(item)}" for item in failed
            )
    text = result.get("msg") or ""
    stdout = (result.get("stdout") or "").strip()
    if stdout.startswith("{"):
        try:  # provision.host.process_runtime prints {"failed": true, "msg": ...}
            text = json.loads(stdout.splitlines()[-1]).get("msg") or text
        except (ValueError, AttributeError):
            pass
    stderr = (result.get("stderr") or "").strip()
    if stderr and stderr not in text:
        text = f"{text}\n{stderr[-2000:]}" if text else stderr[-2000:]
    return text or json.dumps(result)[:2000]


class _Progress:
    """ansible-runner event handler: prints a line per finished task and host."""

    def __init__(self, say: Callable[[str], None]):
        self.say = say
        self.failures: list[str] = []
        self.failed_tasks: list[tuple[str, str, str]] = []  # (task, host, message)
        self.reports: dict[str, dict] = {}
        self.started = time.monotonic()
        self.seconds: dict[str, float] = {}  # host -> when its last task ended, from the start

    def __call__(self, event: dict) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data", {})
        host = data.get("host", "")
        if host and kind.startswith("runner_on_"):
            self.seconds[host] = time.monotonic() - self.started
        task = data.get("task", "")
        result = data.get("res", {}) if isinstance(data.get("res"), dict) else {}
        if kind in ("runner_item_on_ok", "runner_item_on_failed"):
            label = result.get("_ansible_item_label", result.get("item", ""))
            status = "failed" if kind.endswith("failed") else ("changed" if result.get("changed") else "ok")
            self.say(f"  {status:<9}{host:<14}{task} ({label})")
        elif kind == "runner_on_ok":
            if task.startswith(REPORT_TASK_PREFIX):
                message = result.get("msg")
                self.reports.setdefault(host, {})[task[len(REPORT_TASK_PREFIX) :]] = message
                if isinstance(message, str):  # a sentence for the user (a dict is data for the caller)
                    self.say(f"  {'note':<9}{host:<14}{message}")
            elif "results" not in result:  # loops were shown item by item
                self.say(f"  {'changed' if result.get('changed') else 'ok':<9}{host:<14}{task}")
        elif kind == "runner_on_skipped":
            self.say(f"  {'skipped':<9}{host:<14}{task}")
        elif kind == "runner_on_failed" and data.get("ignore_errors"):
            # Roles ignore some errors on purpose (in check mode: packages of a repository not added yet).
            self.say(f"  {'ignored':<9}{host:<14}{task} ({result.get('msg', '')[:120]})")
        elif kind == "runner_on_failed" and task == REFAIL_TASK:
            pass
        elif kind == "runner_on_failed":
            self.say(f"  {'FAILED':<9}{host:<14}{task}")
            self.failures.append(f"task '{task}' failed on {host}:\n{_failure_text(result)}")
            self.failed_tasks.append((task, host, _failure_text(result)))
        elif kind == "runner_on_unreachable":
            self.say(f"  {'UNREACHABLE':<9}{host:<14}{task}")
            self.failures.append(
                f"{host} is unreachable: {result.get('msg', '').strip()}\n"
                "check that the host is up and reachable over SSH (fab status), then run the command again"
            )
        return True  # keep the event in the artifacts too


def run_playbook(
    playbook: str,
    extravars: dict,
    say: Callable[[str], None] = print,
    check: bool = False,
    limit: str | None = None,
    forks: int | None = None,
) -> PlaybookResult:
    """Run playbooks/<playbook> on the provisioned inventory (or its hosts that `limit` names); raise PlaybookError on failure.

    forks: how many hosts Ansible works on at once (its default, 5, when None). Each task
    runs on that many hosts side by side; a host that fails drops out and the others go on
    to the end of the playbook, so the error says which hosts finished it.
    """
    import ansible_runner

    private = state_file().parent / "ansible"
    private.mkdir(parents=True, exist_ok=True)
    progress = _Progress(say)
    # ansible-runner installs SIGINT/SIGTERM handlers of its own and leaves them: put the caller's back.
    handlers = {sig: signal.getsignal(sig) for sig in interrupts.SIGNALS}
    mark = f"lab_playbook_run={uuid.uuid4().hex}"  # on the command line of this run's every Ansible process
    lock.record_playbook(mark)  # the next command ends this run if fab is killed while it goes on
    try:
        runner = _run(ansible_runner, private, playbook, extravars, check, progress, mark, limit, forks)
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    log = Path(runner.config.artifact_dir) / "stdout"
    if runner.status == "canceled":
        _end_leftovers(mark)
        raise PlaybookInterrupted(f"{playbook} interrupted (Ctrl-C or SIGTERM); log: {log}")
    if runner.status != "successful" or progress.failures:
        details = "\n\n".join(progress.failures) or f"ansible-runner status: {runner.status}"
        raise PlaybookError(
            f"{playbook} failed.\n{details}{_finished_hosts(runner.stats or {})}\n\nfull log: {log}",
            progress.failed_tasks,
        )
    stats = runner.stats or {}
    return PlaybookResult(
        playbook=playbook,
        changed=dict(stats.get("changed", {})),
        ok=dict(stats.get("ok", {})),
        reports=progress.reports,
        log=log,
        seconds=progress.seconds,
    )


def _finished_hosts(stats: dict) -> str:
    """What a failed run of several hosts did on the others: which hosts went through the whole playbook."""
    stopped = set(stats.get("failures", {})) | set(stats.get("dark", {}))
    finished = sorted(set(stats.get("processed", {})) - stopped)
    if not finished or not stopped:
        return ""
    return (
        f"\n\n{', '.join(sorted(stopped))} stopped there; {', '.join(finished)} went through the whole playbook "
        f"(every task ok)"
    )


def _run(ansible_runner, private: Path, playbook: str, extravars: dict, check: bool, progress, mark: str, limit, forks):
    venv_bin = str(Path(sys.executable).parent)  # ansible-playbook lives beside our Python
    return ansible_runner.run(
        private_data_dir=str(private),
        playbook=str(PLAYBOOKS / playbook),
        inventory=str(inventory_file()),
        extravars=extravars,
        limit=limit,
        forks=forks,
        cmdline=f"{'--check ' if check else ''}--extra-vars {mark}",
        envvars={
            "PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", "")]),
            "ANSIBLE_ROLES_PATH": str(PLAYBOOKS / "roles"),
            "ANSIBLE_PIPELINING": "True",
            "ANSIBLE_RETRY_FILES_ENABLED": "False",
            "ANSIBLE_NOCOLOR": "True",
            "ANSIBLE_DEPRECATION_WARNINGS": "False",
            # Inherited by all that the run starts here: found again if fab is killed (provision.lock).
            PLAYBOOK_RUN_VARIABLE: mark.partition("=")[2],
        },
        event_handler=progress,
        # ansible-runner cancels the playbook on SIGINT/SIGTERM with a handler of its own, except
        # where the caller refuses signals (interrupts.refused: fab run's teardown must finish).
        cancel_callback=(lambda: False) if interrupts.refusing() else None,
        quiet=True,
        rotate_artifacts=20,  # keep the logs of the last 20 runs
    )


def _end_leftovers(mark: str, grace: float = 5.0) -> None:
    """End what a cancelled playbook left running, and wait until it is gone.

    ansible-runner cancels by killing ansible-playbook's process group, but
    Ansible's workers run in sessions of their own and keep waiting on their
    task (a perf_analyzer, a server start), their command lines naming the
    deploy folder. They are found by the run's mark, their children with them.
    """
    end(list(lock.playbook_processes(mark)), grace)

"""One command at a time on one state: a lock file beside the state file (fcntl.flock).

Every task that changes the state or the hosts (provision, deploy, bench, tune,
teardown, run, extend) holds it while it works. A second command waits, saying
who holds it, or with --no-wait refuses at once. The kernel releases a flock
when its holder dies, however it dies; the lock file then still names that
holder (a clean exit empties it), so the next command says it takes over, and
first ends the Ansible runs the dead holder left going (ansible-runner's
ansible-playbook and its workers do not die with the fab that started them).

The lock is re-entrant within one process: `fab run` holds it and calls the
provision, deploy, bench and teardown tasks, which take it again.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from provision.errors import OperationError
from provision.host.background import PLAYBOOK_RUN_VARIABLE, end, environment, processes
from provision.state import state_file


class LockBusy(OperationError):
    """Another command holds the lock and the caller would not wait (--no-wait)."""


_held: dict = {"depth": 0, "descriptor": None, "holder": None}


def lock_file() -> Path:
    path = state_file()
    return path.with_name(path.name + ".lock")


@contextmanager
def held(task: str, wait: bool = True, say: Callable[[str], None] = print) -> Iterator[None]:
    """Hold the state's lock while `fab <task>` works (re-entrant within this process)."""
    if _held["depth"]:
        _held["depth"] += 1
        try:
            yield
        finally:
            _held["depth"] -= 1
        return
    path = lock_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the programs we start
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(descriptor)
            if not wait:
                raise LockBusy(
                    f"{_describe(holder)} is working on this state ({path}): wait for it to end, "
                    "or run this command again without --no-wait to wait for it"
                ) from None
            say(f"waiting for {_describe(holder)} to end (it holds {path}; Ctrl-C stops waiting)")
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            except KeyboardInterrupt:
                raise LockBusy(f"stopped waiting for {_describe(holder)}: nothing was done") from None
        previous = _read(descriptor)
        if previous and previous.get("pid") != os.getpid():  # we hold the flock: that holder is gone
            say(f"taking over the lock of {_describe(previous)}: it ended without releasing it")
            _end_its_playbooks(previous, say)
        _held.update(
            depth=1, descriptor=descriptor, holder={"task": task, "pid": os.getpid(), "since": _now(), "playbooks": []}
        )
        _write(descriptor, _held["holder"])
        try:
            yield
        finally:
            _write(descriptor, None)  # a clean end: the next holder has nothing to take over
            _held.update(depth=0, descriptor=None, holder=None)
    finally:
        os.close(descriptor)  # releases the flock


def record_playbook(mark: str) -> None:
    """Note a playbook run (its mark on every Ansible process's command line) in the lock's holder,
    so that the next command can end it if this one is killed while it runs."""
    if _held["descriptor"] is not None:
        _held["holder"]["playbooks"] = [*_held["holder"]["playbooks"][-9:], mark]
        _write(_held["descriptor"], _held["holder"])


def playbook_processes(mark: str) -> dict[int, str]:
    """The processes of a playbook run (pid -> command line): those that carry its mark on their
    command line (ansible-playbook and its workers) or in their environment (what the tasks run on
    this machine, even once orphaned), and their children."""
    table = processes()
    run_id = mark.partition("=")[2]
    family = {
        pid
        for pid in table
        if pid != os.getpid()
        and (mark in table[pid]["command"] or environment(pid).get(PLAYBOOK_RUN_VARIABLE) == run_id)
    }
    grown = True
    while grown:
        children = {pid for pid, process in table.items() if process["ppid"] in family} - family
        family |= children
        grown = bool(children)
    return {pid: table[pid]["command"] for pid in family if table[pid]["state"] != "Z"}


def _end_its_playbooks(holder: dict, say: Callable[[str], None]) -> None:
    for mark in holder.get("playbooks") or []:
        left = playbook_processes(mark)
        if not left:
            continue
        say(f"ending the Ansible run it left going ({len(left)} process(es)):")
        for pid, command in sorted(left.items()):
            say(f"  {pid} {command[:160]}")
        survivors = end(list(left))
        if survivors:
            say(f"warning: still running after SIGKILL: {', '.join(map(str, survivors))}")


def _describe(holder: dict | None) -> str:
    if not holder:
        return "another fab command"
    return f"fab {holder.get('task', '?')} (pid {holder.get('pid', '?')}, since {holder.get('since', '?')})"


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def _read(descriptor: int) -> dict | None:
    os.lseek(descriptor, 0, os.SEEK_SET)
    text = os.read(descriptor, 65536).decode(errors="replace").strip()
    try:
        holder = json.loads(text) if text else None
    except ValueError:
        return None
    return holder if isinstance(holder, dict) else None


def _write(descriptor: int, holder: dict | None) -> None:
    os.ftruncate(descriptor, 0)
    os.lseek(descriptor, 0, os.SEEK_SET)
    if holder is not None:
        os.write(descriptor, (json.dumps(holder) + "\n").encode())

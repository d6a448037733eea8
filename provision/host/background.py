"""A long-running program in the background, tracked by a pid file and a log file.

The process runtime's services (tritonserver, the API) are such programs.
Standard library only: this module also runs on the serving hosts.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

LOG_TAIL_LINES = 40
# The controller marks every process of an Ansible run with this variable (provision.ansible), so
# that what a killed `fab` left going can be found and ended. A service is not part of the run that
# started it: it is launched without it.
PLAYBOOK_RUN_VARIABLE = "LAB_PLAYBOOK_RUN"


def port_is_free(port: int, host: str = "0.0.0.0") -> bool:
    """Whether nothing listens on `port` (binding it is the only reliable test)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def port_holder(port: int) -> str | None:
    """Who listens on TCP `port` here: "pid 1234 (its command line)", or None when no process
    this user can see holds it (another user's: `sudo ss -ltnp` shows it)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local address "0100007F:1F40", state 0A = LISTEN, inode in column 10
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for pid in processes():
        try:
            descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for descriptor in descriptors:
            try:
                if os.readlink(descriptor) in inodes:
                    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    return f"pid {pid} ({' '.join(command.split())[:120]})"
            except OSError:
                continue
    return None


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that nothing listens on now (for tests, benchmarks, side-by-side servers).

    LAB_PORT_RANGE=FIRST-LAST draws them from that range instead of the kernel's
    ephemeral ones, never the same port twice in one process: parallel test
    workers get disjoint ranges, so one cannot take a port another handed out.
    """
    if os.environ.get("LAB_PORT_RANGE"):
        return _ports_from_range(count, host, os.environ["LAB_PORT_RANGE"])
    sockets = [socket.socket() for _ in range(count)]
    try:
        for probe in sockets:
            probe.bind((host, 0))
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


_handed_out: set[int] = set()


def _ports_from_range(count: int, host: str, port_range: str) -> list[int]:
    first, last = (int(bound) for bound in port_range.split("-"))
    candidates = [port for port in range(first, last + 1) if port not in _handed_out]
    random.shuffle(candidates)
    chosen = []
    for port in candidates:
        if port_is_free(port, host):
            chosen.append(port)
            _handed_out.add(port)
            if len(chosen) == count:
                return chosen
    raise OSError(f"no {count} free ports left in LAB_PORT_RANGE={port_range}")


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped, does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@dataclass
class BackgroundProcess:
    """One program run in its own process group, with `<name>.pid` and `<name>.log` in state_dir."""

    name: str
    state_dir: Path
    stop_timeout_s: float = 25

    @property
    def pid_file(self) -> Path:
        return Path(self.state_dir) / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return Path(self.state_dir) / f"{self.name}.log"

    def pid(self) -> int | None:
        """The pid of the running program, or None (a stale pid file is removed once its group is empty)."""
        pid = self._recorded_pid()
        if pid is None:
            return None
        if pid_alive(pid):
            return pid
        if not group_members(pid):  # children that outlived it keep the file: stop() still reaches them
            self.pid_file.unlink(missing_ok=True)
        return None

    def _recorded_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def launch(self, command: list[str], env: dict, cwd: Path | None = None) -> int:
        """Start `command` in the background; its output is appended to the log file."""
        Path(self.state_dir).mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            log.write(f"\n==== {self.name} start {time.strftime('%Y-%m-%d %H:%M:%S')} ====\n".encode())
            log.flush()
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={name: value for name, value in env.items() if name != PLAYBOOK_RUN_VARIABLE},
                cwd=cwd,
                start_new_session=True,  # its own process group: stop() reaches its children too
            )
        temporary = self.pid_file.with_suffix(".tmp")
        temporary.write_text(f"{process.pid}\n")
        temporary.rename(self.pid_file)
        return process.pid

    def stop(self) -> bool:
        """SIGTERM the process group, SIGKILL it after stop_timeout_s. True if any of it was running.

        The group is signalled even when its leader is gone: a server killed
        outright leaves its children (the python backend's stubs) in it.
        """
        pid = self._recorded_pid()
        if pid is None or not (pid_alive(pid) or group_members(pid)):
            self.pid_file.unlink(missing_ok=True)
            return False
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        while group_members(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        # Whatever is left of the group (the program, or children it left behind) goes now.
        _signal_group(pid, signal.SIGKILL)
        while group_members(pid):
            time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        return True

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_file.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return f"(no log at {self.log_file})"
        return f"last {min(lines, len(text))} lines of {self.log_file}:\n" + "\n".join(text[-lines:])


def processes() -> dict[int, dict]:
    """This machine's processes from /proc: pid -> {"ppid", "pgid", "state", "command"} (zombies included)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # ended while we looked
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (name) ": the name may hold spaces
        table[int(entry.name)] = {"state": fields[0], "ppid": int(fields[1]), "pgid": int(fields[2]), "command": command}
    return table


def environment(pid: int) -> dict[str, str]:
    """A process's environment from /proc ({} where it cannot be read: ended, or another user's)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(entry.decode(errors="replace").partition("=")[::2] for entry in raw.split(b"\0") if entry)


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (a zombie is gone: only its parent's wait() is left)."""
    return [pid for pid, process in processes().items() if process["pgid"] == pgid and process["state"] != "Z"]


def end(pids: list[int], grace_s: float = 5.0) -> list[int]:
    """SIGTERM these processes, SIGKILL those still there after grace_s; the ones that survive even that."""
    for signal_number, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        for pid in pids:
            try:
                os.kill(pid, signal_number)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait_s
        while True:
            pids = [pid for pid in pids if pid_alive(pid)]
            if not pids or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if not pids:
            break
    return pids


def _signal_group(pid: int, signal_number: int) -> None:
    try:
        os.killpg(pid, signal_number)
    except (ProcessLookupError, PermissionError):
        pass

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
        """The pid of the running program, or None (a stale pid file is removed)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if pid_alive(pid):
            return pid
        self.pid_file.unlink(missing_ok=True)
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
                env=env,
                cwd=cwd,
                start_new_session=True,  # its own process group: stop() reaches its children too
            )
        temporary = self.pid_file.with_suffix(".tmp")
        temporary.write_text(f"{process.pid}\n")
        temporary.rename(self.pid_file)
        return process.pid

    def stop(self) -> bool:
        """SIGTERM the process group, SIGKILL it after stop_timeout_s. True if it was running."""
        pid = self.pid()
        if pid is None:
            return False
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        # Whatever is left of the group (the program, or children it left behind) goes now.
        _signal_group(pid, signal.SIGKILL)
        while pid_alive(pid):
            time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        return True

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_file.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return f"(no log at {self.log_file})"
        return f"last {min(lines, len(text))} lines of {self.log_file}:\n" + "\n".join(text[-lines:])


def _signal_group(pid: int, signal_number: int) -> None:
    try:
        os.killpg(pid, signal_number)
    except (ProcessLookupError, PermissionError):
        pass

"""Commands on a provisioned host: a local subprocess, or Fabric over SSH."""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
from pathlib import Path

from provision.errors import OperationError, UsageError
from provision.state import Host


class HostError(OperationError):
    """A host cannot be reached or refused us; the message says what to check."""


# The one answer to "is this host the machine fab runs on?" (the local target), and the words for it.
THIS_MACHINE = "the local target is this machine"


def is_this_machine(host: Host) -> bool:
    """Whether the host is the machine fab runs on: no SSH to it, no tunnel, no cluster of it."""
    return host.connection == "local"


def _connection(host: Host, timeout_s: float):
    from fabric import Connection

    connect_kwargs = {"key_filename": [host.key]} if host.key else {}
    connect_kwargs["look_for_keys"] = not host.key
    return Connection(
        host.address, user=host.user or None, port=host.port, connect_timeout=timeout_s, connect_kwargs=connect_kwargs
    )


def run(host: Host, command: str, timeout_s: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a shell command on the host; returns its exit status and output (never raises on status)."""
    if env:
        command = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items()) + " " + command
    if is_this_machine(host):
        return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout_s)
    try:
        with _connection(host, timeout_s) as connection:
            result = connection.run(command, hide=True, warn=True, timeout=timeout_s, in_stream=False)
    except Exception as error:  # noqa: BLE001 - paramiko raises many kinds; all mean "cannot use the host"
        raise HostError(describe_ssh_error(host, error)) from None
    return subprocess.CompletedProcess(command, result.exited, result.stdout, result.stderr)


def put(host: Host, local: Path, remote: str, timeout_s: float = 60) -> None:
    """Copy a file of this machine to the host (an absolute path there)."""
    if is_this_machine(host):
        shutil.copyfile(local, remote)
        return
    try:
        with _connection(host, timeout_s) as connection:
            connection.put(str(local), remote)
    except Exception as error:  # noqa: BLE001 - as in run()
        raise HostError(describe_ssh_error(host, error)) from None


def describe_ssh_error(host: Host, error: Exception) -> str:
    """One sentence on what went wrong with SSH and what to check."""
    import paramiko

    where = f"{host.user + '@' if host.user else ''}{host.address}:{host.port}"
    retry = f"check with `ssh -p {host.port}{' -i ' + host.key if host.key else ''} {where.rsplit(':', 1)[0]}`"
    if isinstance(error, paramiko.AuthenticationException):
        key = host.key or "your default keys"
        return f"{where} refused the key {key} for user {host.user or '(default)'}: check --user and --key; {retry}"
    if isinstance(error, (socket.timeout, TimeoutError)):
        return f"{where} did not answer within the timeout: check the address and that the host is up; {retry}"
    if isinstance(error, (paramiko.ssh_exception.NoValidConnectionsError, ConnectionRefusedError)):
        return f"{where} refused the connection: is sshd running on port {host.port}? {retry}"
    if isinstance(error, socket.gaierror):
        return f"{host.address} is not a known host name: check the spelling"
    if isinstance(error, FileNotFoundError):
        return f"the key file {host.key} does not exist: check --key"
    return f"cannot connect to {where}: {error}; {retry}"


def select(hosts: list[Host], node: str) -> Host:
    """The host named `node`, or the one at index `node` (`fab ssh --node`, `fab tunnel --node`)."""
    chosen = next((h for h in hosts if h.name == node), None)
    if chosen is None and node.isdigit() and int(node) < len(hosts):
        chosen = hosts[int(node)]
    if chosen is None:
        raise UsageError(f"no host {node!r}; hosts: {', '.join(h.name for h in hosts)}")
    return chosen


def ssh_client_command(host: Host, *options: str) -> list[str]:
    """The system `ssh` client's command line for `host`, `options` before the destination.

    It trusts host keys as Ansible does (first contact recorded in the
    project's own known_hosts, a changed key refused), so `fab ssh` and
    `fab tunnel` accept exactly the hosts the deploy accepted.
    """
    from provision.inventory import known_hosts_file

    command = ["ssh", "-p", str(host.port), "-o", "StrictHostKeyChecking=accept-new",
               "-o", f"UserKnownHostsFile={known_hosts_file()}"]  # fmt: skip
    if host.key:
        command += ["-i", host.key]
    return [*command, *options, f"{host.user}@{host.address}" if host.user else host.address]


def forget_host_key(address: str, port: int = 22) -> bool:
    """Remove `address`'s key from the project's known_hosts; True if it had one.

    For an address that goes back to the cloud's pool (teardown) or that the cloud has
    just given us (provision): cloud addresses come back from a small pool, and the next
    node behind one has a key of its own, which SSH would refuse as "host key changed".
    """
    from provision.inventory import known_hosts_file

    known = known_hosts_file()
    if not known.exists():
        return False
    name = address if int(port) == 22 else f"[{address}]:{port}"
    done = subprocess.run(["ssh-keygen", "-R", name, "-f", str(known)], capture_output=True, text=True)
    known.with_name(known.name + ".old").unlink(missing_ok=True)  # ssh-keygen's backup
    return done.returncode == 0 and "found" in done.stdout + done.stderr


def check_reachable(host: Host, timeout_s: float = 15) -> str:
    """Log in and find python3; return its version. Raise HostError saying what to fix."""
    result = run(host, "python3 --version", timeout_s=timeout_s)
    if result.returncode != 0:
        raise HostError(f"{host.address} has no python3 (Ansible needs it): install python3 there")
    return (result.stdout or result.stderr).strip()

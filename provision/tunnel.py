"""fab tunnel: a deployed host's Triton, API and Jupyter on this machine's ports, over SSH.

The services listen on the host's bind_address (127.0.0.1) only, so nothing of
ours is open to the network. The system `ssh` client forwards a local port to
each of them (`ssh -N -L 127.0.0.1:LOCAL:127.0.0.1:REMOTE ...`) until the user
presses Ctrl-C. The ports are the ones the deploy recorded in the state (from
the `lab.ports` settings), moved by `--offset` when they are taken here.

The Jupyter token is read from the host (`<home>/run/jupyter.token`, the same
file for the process and the docker runtime) and only printed to the terminal:
it never goes into the state, a log or a file.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from provision import cluster as clusters
from provision import hosts as host_commands
from provision.errors import OperationError
from provision.host.background import port_is_free
from provision.host.layout import TOKEN_FILE, reachable_address
from provision.state import Host, State

LOCAL_ADDRESS = "127.0.0.1"  # the tunnel's end here: the user's machine only, as on the host
READY_TIMEOUT_S = 60  # login and the forwards' listeners; ssh's ConnectTimeout covers a silent host
STDERR_LINES = 40  # how much of ssh's stderr an error shows

# (service, its port's name in lab.ports, the page to open first)
SERVICES = (("triton", "triton_http", "/v2/health/ready"), ("api", "api", "/docs"), ("jupyter", "jupyter", "/lab"))
# A cluster's balancer, on its host (fab deploy --cluster): the cluster's Triton HTTP address.
BALANCER = ("balancer", "balancer_http", "/v2/health/ready")


class TunnelError(OperationError):
    """The tunnel cannot be opened or broke; the message says what to do."""


@dataclass(frozen=True)
class Forward:
    """One forwarded service: LOCAL_ADDRESS:local_port here -> remote_address:remote_port on the host."""

    service: str
    local_port: int
    remote_port: int
    path: str
    remote_address: str = "127.0.0.1"

    def url(self, address: str = LOCAL_ADDRESS, port: int | None = None, token: str | None = None) -> str:
        query = f"?token={token}" if token else ""
        return f"http://{address}:{port or self.local_port}{self.path}{query}"


def forwards(state: State, host: Host, offset: int = 0) -> list[Forward]:
    """The forwards for the host's deployed ports (and a cluster's balancer on its host), local port = remote port + offset."""
    ports = state.deploy["ports"]
    address = remote_address(state, host)
    planned = [
        Forward(service, int(ports[name]) + offset, int(ports[name]), path, address) for service, name, path in SERVICES
    ]
    balancer = clusters.balancer_host(state)
    if balancer is not None and balancer.name == host.name:
        service, name, path = BALANCER
        planned.append(
            Forward(service, int(ports[name]) + offset, int(ports[name]), path, clusters.balancer_address(state))
        )
    for forward in planned:
        if not 0 < forward.local_port < 65536:
            raise TunnelError(
                f"--offset {offset} puts {forward.service} on local port {forward.local_port}, outside 1-65535"
            )
    return planned


def remote_address(state: State, host: Host) -> str:
    """Where the host's services listen; a wildcard bind is reached on the loopback."""
    return reachable_address(clusters.deployed_bind_addresses(state)[host.name])


def deployed_home(state: State, host: Host) -> str:
    """The host's deploy folder as its deploy reported it (absolute), else the configured one."""
    reported = state.deploy.get("hosts", {}).get(host.name) or {}
    home = reported.get("home") or state.deploy.get("home")
    if not home:
        raise TunnelError(f"nothing is deployed on {host.name}: run `fab deploy` first")
    return home


def read_token(host: Host, home: str) -> str | None:
    """Jupyter's token from the host, or None when there is no token file (Jupyter not deployed)."""
    # "~/..." must reach the remote shell unquoted to expand there; the rest is quoted.
    path = f"{home}/{TOKEN_FILE}"
    quoted = '"$HOME"/' + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)
    try:
        result = host_commands.run(host, f"cat -- {quoted}", timeout_s=30)
    except host_commands.HostError as error:
        raise TunnelError(str(error)) from None
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


def check_ports_free(planned: list[Forward]) -> None:
    """Refuse before ssh starts: its own message for a taken port is terse and names no service."""
    busy = []
    for forward in planned:
        try:
            if not port_is_free(forward.local_port, LOCAL_ADDRESS):
                busy.append(forward)
        except OSError as error:  # e.g. a port under 1024 without root
            raise TunnelError(f"cannot listen on local port {forward.local_port}: {error}") from None
    if busy:
        named = ", ".join(f"{f.local_port} ({f.service})" for f in busy)
        hint = _free_offset(planned)
        example = f", e.g. --offset {hint}" if hint is not None else ""
        raise TunnelError(
            f"local port(s) {named} already in use on this machine: "
            f"choose others with --offset N (local port = remote port + N){example}"
        )


def _free_offset(planned: list[Forward]) -> int | None:
    """A round offset (from the current one) under which every local port is free, to suggest."""
    for step in range(1000, 30001, 1000):
        ports = [f.local_port + step for f in planned]
        if all(port < 65536 and port_is_free(port, LOCAL_ADDRESS) for port in ports):
            return planned[0].local_port - planned[0].remote_port + step
    return None


def ssh_command(host: Host, planned: list[Forward]) -> list[str]:
    """`ssh -N` with one -L per service; it exits if a forward cannot be set up."""
    options = ["-N", "-T", "-o", "ExitOnForwardFailure=yes", "-o", "ConnectTimeout=15",
               # A host that went away closes the tunnel (and tells) instead of hanging.
               "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3"]  # fmt: skip
    for forward in planned:
        options += ["-L", f"{LOCAL_ADDRESS}:{forward.local_port}:{forward.remote_address}:{forward.remote_port}"]
    return host_commands.ssh_client_command(host, *options)


def local_target_message(state: State, host: Host) -> str:
    """What `fab tunnel` says on the local target: the services need no tunnel, here they are."""
    token = read_token(host, deployed_home(state, host))
    urls = [
        f.url(f.remote_address, f.remote_port, token if f.service == "jupyter" else None) for f in forwards(state, host)
    ]
    return f"{host_commands.THIS_MACHINE}: the services are already at {', '.join(urls)} (no tunnel needed)"


class _Ssh:
    """The running ssh client; its stderr is drained by a thread (a full pipe would stall ssh)."""

    def __init__(self, command: list[str]):
        try:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
        except FileNotFoundError:
            raise TunnelError("no `ssh` client on this machine: install OpenSSH's client (openssh-client)") from None
        self.tail: deque[str] = deque(maxlen=STDERR_LINES)
        self.echo: Callable[[str], None] | None = None  # set once the tunnel is up: show what ssh says then
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self) -> None:
        for line in self.process.stderr:
            self.tail.append(line.rstrip())
            if self.echo:
                self.echo(f"ssh: {line.rstrip()}")

    def stderr(self) -> str:
        self.reader.join(timeout=2)  # ssh has exited: the rest of its stderr is on the way
        return "\n".join(self.tail) or "(ssh printed nothing)"

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _wait_until_up(ssh: _Ssh, planned: list[Forward], stop: threading.Event) -> None:
    """Until ssh listens on every local port (it does after login); raise if it exits first."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not stop.is_set():
        if ssh.process.poll() is not None:
            raise TunnelError(f"ssh exited ({ssh.process.returncode}) before the tunnel was up:\n{ssh.stderr()}")
        if not any(port_is_free(f.local_port, LOCAL_ADDRESS) for f in planned):
            return
        if time.monotonic() > deadline:
            raise TunnelError(f"ssh did not open the tunnel within {READY_TIMEOUT_S} s:\n{ssh.stderr()}")
        stop.wait(0.1)


def run(state: State, node: str = "0", offset: int = 0, say: Callable[[str], None] = print) -> None:
    """Open the tunnel to one host, print the local URLs, keep it open until Ctrl-C (or SIGTERM/SIGHUP)."""
    try:
        host = host_commands.select(state.hosts, node)
    except ValueError as error:
        raise TunnelError(str(error)) from None
    if state.deploy.get("status") != "deployed" or not state.deploy.get("ports"):
        raise TunnelError("nothing is deployed: run `fab deploy` first")
    if host_commands.is_this_machine(host):  # nothing to forward: information, not an error
        say(local_target_message(state, host))
        return
    planned = forwards(state, host, offset)
    check_ports_free(planned)
    token = read_token(host, deployed_home(state, host))

    ssh = _Ssh(ssh_command(host, planned))
    # Ctrl-C, a closed terminal or a kill end the tunnel the same way: cleanly, exit status 0.
    # (Ctrl-C reaches ssh too, as it runs in our process group; stop is set before it exits.)
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    try:
        _wait_until_up(ssh, planned, stop)
        if not stop.is_set():
            where = f"{host.user + '@' if host.user else ''}{host.address}:{host.port}"
            say(f"tunnel to {host.name} ({where}) open; Ctrl-C closes it")
            for forward in planned:
                url = forward.url(token=token if forward.service == "jupyter" else None)
                note = "" if token or forward.service != "jupyter" else "  (no token on the host: is Jupyter deployed?)"
                say(f"  {forward.service + ':':<8} {url}{note}")
            ssh.echo = say
        while not stop.wait(0.5):
            if ssh.process.poll() is not None:
                raise TunnelError(f"the tunnel closed: ssh exited ({ssh.process.returncode}):\n{ssh.stderr()}")
    finally:
        ssh.echo = None
        ssh.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    say("tunnel closed")

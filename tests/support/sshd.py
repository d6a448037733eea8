"""A real OpenSSH server on 127.0.0.1 for the ssh-target tests: own config, host key, authorized key."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


@dataclass
class TestSshd:
    port: int
    user: str
    key: Path  # the client's private key, authorized for `user`
    process: subprocess.Popen
    log: Path

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def start_sshd(folder: Path, port: int) -> TestSshd:
    if not os.path.exists(SSHD):
        raise RuntimeError("sshd not found: `make test` installs openssh-server (apt-get install openssh-server)")
    folder.mkdir(parents=True, exist_ok=True)
    host_key, client_key = folder / "host_ed25519", folder / "client_ed25519"
    _keygen(host_key)
    _keygen(client_key)
    authorized = folder / "authorized_keys"
    authorized.write_text((client_key.with_suffix(".pub")).read_text())
    authorized.chmod(0o600)
    config = folder / "sshd_config"
    config.write_text(
        f"""Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
AuthorizedKeysFile {authorized}
PidFile {folder / "sshd.pid"}
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
Subsystem sftp internal-sftp
"""
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory
    log = folder / "sshd.log"
    # sshd re-executes itself: it needs its absolute path.
    process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=open(log, "wb"))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited: {log.read_text()}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return TestSshd(port=port, user=getpass.getuser(), key=client_key, process=process, log=log)
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"sshd did not listen on {port}: {log.read_text()}")

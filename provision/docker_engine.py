"""A Docker engine of the project's own on this machine, and local stand-ins for the two base images.

For the docker runtime on a machine that reaches no container registry (this
one, CI) and may run another engine: the tests and the benchmarks use it.

    python -m provision.docker_engine install   # Debian's docker.io and debootstrap; Compose v2 and buildx
    python -m provision.docker_engine start     # dockerd with its own data root, exec root, socket and pidfile
    python -m provision.docker_engine bases     # the stand-in base images (below)
    python -m provision.docker_engine stop

`make docker-bases` runs all three first steps. A deployment selects the engine
and the stand-ins by configuration only (FABRIC_LAB_DOCKER_ENGINE_HOST,
FABRIC_LAB_DOCKER_TRITON_IMAGE, FABRIC_LAB_DOCKER_PYTHON_IMAGE: see `settings()`).

The stand-ins:
- python: a Debian bookworm root (`debootstrap --variant=minbase`) with
  Python 3.11 and pip, imported with `docker import`, for python:3.11-slim-bookworm;
- tritonserver: that, plus tritonserver 2.51 (the release in NGC 24.10) laid
  out at /opt/tritonserver from the nvidia-pytriton wheel, as
  provision/host/tritonserver.py lays it out for the process runtime.
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from provision.config import PROJECT_ROOT
from provision.host.tritonserver import TritonRuntime

ENGINE_ROOT = PROJECT_ROOT / ".runtime" / "docker"
SOCKET = ENGINE_ROOT / "docker.sock"
DOCKER_HOST = f"unix://{SOCKET}"
# containerd's shim sockets live under the exec root: a short path keeps them under the 108-byte limit.
EXEC_ROOT = Path("/run/triton-lab-docker")

PYTHON_STANDIN = "triton-lab-standin/python:3.11-bookworm"
TRITON_STANDIN = "triton-lab-standin/tritonserver:2.51.0"
# What the python stand-in holds (python:3.11-slim has python, pip and CA certificates;
# libb64-0d is what Dockerfile.api would otherwise fetch with apt, which needs the network).
BASE_PACKAGES = ("python3", "python3-pip", "python-is-python3", "libpython3.11", "ca-certificates", "libb64-0d")
# Compose v2 and buildx: bookworm's docker.io 20.10 has neither; trixie packages them as static binaries.
CLI_PLUGINS = {"docker-compose": "docker-compose", "docker-buildx": "docker-buildx"}
PLUGIN_DIR = Path("/usr/local/lib/docker/cli-plugins")
PLUGIN_SUITE = "trixie"


def docker(*args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, DOCKER_HOST=DOCKER_HOST)
    return subprocess.run(["docker", *args], check=check, env=env, text=True, **kwargs)


def settings() -> dict[str, str]:
    """The FABRIC_LAB_* variables that point a deployment at this engine and these bases."""
    return {
        "FABRIC_LAB_DOCKER_ENGINE_HOST": DOCKER_HOST,
        "FABRIC_LAB_DOCKER_TRITON_IMAGE": TRITON_STANDIN,
        "FABRIC_LAB_DOCKER_PYTHON_IMAGE": PYTHON_STANDIN,
    }


# --------------------------------------------------------------------------- install


def debian_mirror() -> str:
    """The Debian mirror of the host's apt sources."""
    for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]:
        text = path.read_text() if path.is_file() else ""
        for url in re.findall(r"(?:URIs:|deb)\s+(\S+/debian)/?\s", text):
            return url
    return "http://deb.debian.org/debian"


def install_cli_plugins() -> None:
    """Compose v2 and buildx from Debian trixie's packages, checked against the Packages index."""
    mirror = debian_mirror()
    missing = [name for name in CLI_PLUGINS.values() if not (PLUGIN_DIR / name).exists()]
    if not missing:
        return
    with urllib.request.urlopen(f"{mirror}/dists/{PLUGIN_SUITE}/main/binary-amd64/Packages.xz", timeout=120) as reply:
        index = lzma.decompress(reply.read()).decode()
    PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
    for package, binary in CLI_PLUGINS.items():
        if binary not in missing:
            continue
        stanza = re.search(rf"^Package: {package}\n(.*?)\n\n", index, flags=re.MULTILINE | re.DOTALL)
        if stanza is None:
            raise SystemExit(f"{package} is not in {mirror} {PLUGIN_SUITE}")
        fields = dict(re.findall(r"^(\w[\w-]*): (.*)$", stanza[1], flags=re.MULTILINE))
        with urllib.request.urlopen(f"{mirror}/{fields['Filename']}", timeout=300) as reply:
            deb = reply.read()
        if hashlib.sha256(deb).hexdigest() != fields["SHA256"]:
            raise SystemExit(f"{package}: checksum mismatch")
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "package.deb").write_bytes(deb)
            subprocess.run(["dpkg-deb", "-x", f"{folder}/package.deb", f"{folder}/root"], check=True)
            shutil.copy2(Path(folder) / "root/usr/libexec/docker/cli-plugins" / binary, PLUGIN_DIR / binary)
        print(f"installed {package} {fields['Version']} (Debian {PLUGIN_SUITE}) in {PLUGIN_DIR}")


def install() -> None:
    needed = [tool for tool in ("dockerd", "debootstrap") if shutil.which(tool) is None]
    if needed:
        if os.geteuid() != 0:
            raise SystemExit("the docker tests need: sudo apt-get install docker.io debootstrap")
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "docker.io", "debootstrap", "iptables"],
            check=True, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"), stdout=subprocess.DEVNULL,
        )  # fmt: skip
    install_cli_plugins()


# --------------------------------------------------------------------------- the engine


def running() -> bool:
    return SOCKET.exists() and docker("version", check=False, capture_output=True).returncode == 0


def start(timeout_s: float = 60) -> None:
    if running():
        return
    ENGINE_ROOT.mkdir(parents=True, exist_ok=True)
    log = (ENGINE_ROOT / "dockerd.log").open("a")
    subprocess.Popen(
        [
            "dockerd",
            f"--data-root={ENGINE_ROOT / 'data'}",
            f"--exec-root={EXEC_ROOT}",
            f"--host={DOCKER_HOST}",
            f"--pidfile={ENGINE_ROOT / 'docker.pid'}",
            "--storage-driver=overlay2",
        ],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while not running():
        if time.monotonic() > deadline:
            tail = (ENGINE_ROOT / "dockerd.log").read_text()[-2000:]
            raise SystemExit(f"dockerd did not answer on {SOCKET} within {timeout_s:.0f} s:\n{tail}")
        time.sleep(0.5)
    print(f"dockerd runs: DOCKER_HOST={DOCKER_HOST}")


def stop() -> None:
    pidfile = ENGINE_ROOT / "docker.pid"
    if pidfile.exists():
        subprocess.run(["kill", pidfile.read_text().strip()], check=False)
        for _ in range(60):
            if not pidfile.exists():
                break
            time.sleep(0.5)


# --------------------------------------------------------------------------- the base images


def has_image(tag: str) -> bool:
    return docker("image", "inspect", tag, check=False, capture_output=True).returncode == 0


def import_debian_root(tag: str, packages: tuple[str, ...], tidy, changes: tuple[str, ...] = ()) -> None:
    """A Debian bookworm root (`debootstrap --variant=minbase` with `packages`), `tidy(root)` applied,
    imported as image `tag` (Dockerfile instructions `changes` applied by `docker import`)."""
    with tempfile.TemporaryDirectory(dir=ENGINE_ROOT) as folder:
        root = Path(folder) / "root"
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", "bookworm", str(root),
             debian_mirror()],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        tidy(root)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        options = [argument for change in ("ENV LANG=C.UTF-8", *changes) for argument in ("--change", change)]
        docker("import", *options, "-", tag, stdin=tar.stdout, stdout=subprocess.DEVNULL)
        tar.wait()
    print(f"built {tag}")


def _tidy_python_root(root: Path) -> None:
    # python:3.11-slim's pip installs as root; Debian's refuses without this marker gone (PEP 668).
    for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True)


def build_python_standin() -> None:
    if not has_image(PYTHON_STANDIN):
        import_debian_root(PYTHON_STANDIN, BASE_PACKAGES, _tidy_python_root, changes=('CMD ["python3"]',))


TRITON_STANDIN_DOCKERFILE = f"""\
FROM {PYTHON_STANDIN}
# NGC's layout: tritonserver on PATH, its backends where it looks by default.
COPY pytriton/tritonserver /opt/tritonserver
COPY nvidia_pytriton.libs /opt/tritonserver/bundled-libs
ENV PATH=/opt/tritonserver/bin:$PATH \\
    LD_LIBRARY_PATH=/opt/tritonserver/bundled-libs
CMD ["tritonserver"]
"""


def build_triton_standin() -> None:
    if has_image(TRITON_STANDIN):
        return
    # The wheel that `make runtime` unpacked, with its Python backend stub for Python 3.11 installed.
    runtime = TritonRuntime(PROJECT_ROOT / ".runtime" / "triton")
    if not (runtime.backends / "python" / "triton_python_backend_stub").exists():
        raise SystemExit("no Triton runtime in .runtime/triton: run `make runtime` first")
    docker(
        "build", "--quiet", "--tag", TRITON_STANDIN, "--file", "-", str(runtime.wheel),
        input=TRITON_STANDIN_DOCKERFILE, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    print(f"built {TRITON_STANDIN}")


def bases() -> None:
    build_python_standin()
    build_triton_standin()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["install", "start", "bases", "stop", "env"])
    command = parser.parse_args().command
    if command == "env":  # for a shell: eval "$(python tests/docker_engine.py env)"
        for name, value in {"DOCKER_HOST": DOCKER_HOST, **settings()}.items():
            print(f"export {name}={value}")
        return
    {"install": install, "start": start, "bases": bases, "stop": stop}[command]()


if __name__ == "__main__":
    main()

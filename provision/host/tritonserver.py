"""A real Triton Inference Server without Docker or a GPU: install, start, wait, stop.

The PyPI wheel nvidia-pytriton 0.7.0 carries a complete tritonserver 2.51.0
(the release in NGC 24.10, the image the P100 node runs) with its Python
backend, and tritonclient 2.51.0 carries perf_analyzer. `install` lays them
out in a runtime folder; `TritonProcess` runs the server as a background
process with a pid file and a log file. Only the standard library is used
here, so the same file can run on any host that has the serving Python
(the process runtime drives it there: provision.host.process_runtime).

On the controller, `python -m provision.local_serving install|start|status|stop`
is its command line for this machine.
"""

from __future__ import annotations

import filecmp
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from provision.host.background import BackgroundProcess, free_ports, port_is_free
from provision.host.layout import http_json

DEFAULT_WHEEL = "nvidia-pytriton==0.7.0"
# Every model loads at start, and a deploy (or `fab tune`) loads or unloads one
# model through the repository API while the others keep serving. Every config.pbtxt
# we render is complete, so the server is told not to complete them: completing one
# costs the python backend a stub process of its own (torch imported) per model
# before the model's instances start theirs. Leaving it out more than halves a
# start, and the server serves the same configs (benchmarks/server_start.py: every
# model READY in 10.0 s instead of 23.8 s on 2 cores).
# Both runtimes start tritonserver with these (the docker one through compose.yaml).
MODEL_LOADING = ("--model-control-mode=explicit", "--load-model=*", "--disable-auto-complete-config")
# The python backend's shared memory: /dev/shm/triton_python_backend_shm_region_<...>, one set per server.
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"


class TritonError(RuntimeError):
    """The local Triton could not be installed, started or stopped; the message says why."""


# --------------------------------------------------------------------------- install


@dataclass(frozen=True)
class TritonRuntime:
    """Where the pieces of an installed runtime are."""

    root: Path

    @property
    def wheel(self) -> Path:  # the unpacked nvidia-pytriton wheel
        return self.root / "pytriton-wheel"

    @property
    def server_dir(self) -> Path:
        return self.wheel / "pytriton" / "tritonserver"

    @property
    def tritonserver(self) -> Path:
        return self.server_dir / "bin" / "tritonserver"

    @property
    def backends(self) -> Path:
        return self.server_dir / "backends"

    @property
    def bundled_libs(self) -> Path:  # shared libraries the wheel ships (hashed names)
        return self.wheel / "nvidia_pytriton.libs"

    @property
    def lib(self) -> Path:  # plain-named links perf_analyzer looks for
        return self.root / "lib"

    @property
    def manifest(self) -> Path:
        return self.root / "triton-runtime.json"

    def read_manifest(self) -> dict:
        try:
            return json.loads(self.manifest.read_text())
        except FileNotFoundError:
            raise TritonError(
                f"no Triton runtime installed in {self.root}: run `python -m provision.local_serving install`"
            ) from None


def _python_facts(python: str) -> dict:
    """Version and libpython folder of the serving Python."""
    code = (
        "import json, sys, sysconfig; print(json.dumps({"
        "'version': '%d.%d' % sys.version_info[:2],"
        "'libdir': sysconfig.get_config_var('LIBDIR'),"
        "'multiarch': sysconfig.get_config_var('MULTIARCH') or ''}))"
    )
    facts = json.loads(subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout)
    # The stub links libpython3.X.so.1.0: pyenv/python.org builds with
    # --enable-shared have it in LIBDIR, Debian ships it in package libpython3.X.
    library = f"libpython{facts['version']}.so.1.0"
    candidates = [Path(facts["libdir"]), Path(facts["libdir"]) / facts["multiarch"]]
    found = next((folder for folder in candidates if (folder / library).exists()), None)
    if found is None:
        raise TritonError(
            f"{library} not found for {python}: Triton's Python backend stub needs a shared libpython "
            f"(Debian/Ubuntu: apt-get install libpython{facts['version']}; "
            "pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared)"
        )
    facts["libdir"] = str(found)
    return facts


def _link_plain_name(lib_dir: Path, bundled: Path, pattern: str, plain_name: str) -> None:
    matches = sorted(bundled.glob(pattern))
    if not matches:
        raise TritonError(f"{pattern} not found in {bundled}: is the {DEFAULT_WHEEL} wheel complete?")
    link = lib_dir / plain_name
    if link.is_symlink() and Path(os.readlink(link)) == matches[0]:
        return
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(matches[0])


def install(root: Path, serving_python: str = sys.executable, wheel: str = DEFAULT_WHEEL) -> TritonRuntime:
    """Lay out tritonserver and its Python backend for `serving_python` in `root`.

    Idempotent: the wheel is fetched once; the stub and links are refreshed.
    """
    runtime = TritonRuntime(Path(root).resolve())
    facts = _python_facts(serving_python)
    if not runtime.tritonserver.exists():
        runtime.root.mkdir(parents=True, exist_ok=True)
        staging = runtime.wheel.with_name(runtime.wheel.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(staging), wheel]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise TritonError(f"could not fetch {wheel}:\n{result.stderr.strip()[-2000:]}")
        staging.rename(runtime.wheel)

    # The Python backend runs models in a stub process built for one Python version.
    stub = runtime.server_dir / "python_backend_stubs" / facts["version"] / "triton_python_backend_stub"
    if not stub.exists():
        available = sorted(p.name for p in (runtime.server_dir / "python_backend_stubs").iterdir())
        raise TritonError(f"no Python backend stub for Python {facts['version']} (available: {available})")
    installed_stub = runtime.backends / "python" / "triton_python_backend_stub"
    # Only when it differs: a running server holds the stub ("text file busy").
    if not installed_stub.exists() or not filecmp.cmp(stub, installed_stub, shallow=False):
        shutil.copy2(stub, installed_stub)

    # perf_analyzer (tritonclient wheel) needs these two under their plain names.
    runtime.lib.mkdir(parents=True, exist_ok=True)
    _link_plain_name(runtime.lib, runtime.bundled_libs, "libb64-*.so.0d", "libb64.so.0d")
    _link_plain_name(runtime.lib, runtime.bundled_libs, "libcudart-*.so.12*", "libcudart.so.12")

    manifest = {
        "triton_wheel": wheel,
        "tritonserver": str(runtime.tritonserver),
        "backends": str(runtime.backends),
        "serving_python": serving_python,
        "python_version": facts["version"],
        "ld_library_path": [str(runtime.bundled_libs), facts["libdir"]],
        "perf_analyzer_ld_library_path": [str(runtime.lib)],
    }
    text = json.dumps(manifest, indent=2) + "\n"
    if not runtime.manifest.exists() or runtime.manifest.read_text() != text:
        runtime.manifest.write_text(text)
    return runtime


def perf_analyzer_env(root: Path, base: dict | None = None) -> dict:
    """The environment in which perf_analyzer finds its libraries."""
    manifest = TritonRuntime(Path(root)).read_manifest()
    env = dict(os.environ if base is None else base)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        manifest["perf_analyzer_ld_library_path"] + [p for p in [env.get("LD_LIBRARY_PATH")] if p]
    )
    return env


# --------------------------------------------------------------------------- run


@dataclass
class TritonProcess:
    """One tritonserver run in the background (pid file and log file in state_dir)."""

    runtime_root: Path
    model_repository: Path
    state_dir: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    host: str = "127.0.0.1"  # what clients connect to
    exit_timeout_s: int = 10

    @classmethod
    def on_free_ports(cls, runtime_root: Path, model_repository: Path, state_dir: Path) -> TritonProcess:
        """A server on three ports that are free now: for tests and benchmarks beside a deployment."""
        http_port, grpc_port, metrics_port = free_ports(3)
        return cls(runtime_root, model_repository, state_dir, http_port, grpc_port, metrics_port)

    def __post_init__(self):
        # The stubs may need the whole exit timeout to finish in-flight requests.
        self.process = BackgroundProcess("tritonserver", Path(self.state_dir), stop_timeout_s=self.exit_timeout_s + 15)

    @property
    def pid_file(self) -> Path:
        return self.process.pid_file

    @property
    def log_file(self) -> Path:
        return self.process.log_file

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    def command(self) -> list[str]:
        manifest = TritonRuntime(Path(self.runtime_root)).read_manifest()
        return [
            manifest["tritonserver"],
            f"--model-repository={Path(self.model_repository).resolve()}",
            f"--backend-directory={manifest['backends']}",
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.metrics_port}",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            "--strict-readiness=true",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            *MODEL_LOADING,
        ]

    @property
    def shm_prefix(self) -> str:
        """The python backend's shared-memory regions of this server (/dev/shm/<prefix>*): its own name,
        from its state folder, so that a stop removes what a killed server left there and nothing else."""
        digest = hashlib.sha256(str(Path(self.state_dir).resolve()).encode()).hexdigest()[:12]
        return f"{SHM_PREFIX}{digest}_"

    def shm_regions(self) -> list[Path]:
        return sorted(SHM_DIR.glob(f"{self.shm_prefix}*"))

    def environment(self) -> dict:
        manifest = TritonRuntime(Path(self.runtime_root)).read_manifest()
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(manifest["ld_library_path"])
        # The stub's embedded Python ignores PYTHONPATH; it takes its sys.prefix
        # from the first `python3` on PATH. With the serving venv first there,
        # the venv's pyvenv.cfg puts its site-packages on sys.path.
        serving_bin = str(Path(manifest["serving_python"]).parent)
        env["PATH"] = os.pathsep.join([serving_bin, env.get("PATH", "")])
        env["VIRTUAL_ENV"] = str(Path(serving_bin).parent)
        env.pop("PYTHONHOME", None)
        env.pop("PYTHONPATH", None)
        # The backend starts each stub through bash. Under an SSH session
        # (Ansible) bash sources ~/.bashrc when it sees SSH_CLIENT, and a
        # .bashrc that sets up pyenv or conda puts another python3 first on
        # PATH. Without these variables bash leaves PATH alone.
        for variable in ("SSH_CLIENT", "SSH2_CLIENT", "BASH_ENV", "ENV"):
            env.pop(variable, None)
        return env

    # -- lifecycle

    def pid(self) -> int | None:
        return self.process.pid()

    def start(self, expected_models: list[str] | None = None, timeout_s: float = 300) -> dict[str, str]:
        """Start the server and wait until it and every expected model are READY.

        Returns {model: state}. Already running: only waits. Raises TritonError
        with the log's last lines if the server exits or is not ready in time.
        """
        if self.pid() is None:
            busy = [p for p in (self.http_port, self.grpc_port, self.metrics_port) if not port_is_free(p, self.host)]
            if busy:
                raise TritonError(
                    f"port(s) {busy} already in use on this host: stop what listens there "
                    f"(`ss -ltnp | grep :{busy[0]}`) or choose other ports"
                )
            self.process.launch(self.command(), self.environment())
        return self.wait_ready(expected_models, timeout_s)

    def wait_ready(self, expected_models: list[str] | None = None, timeout_s: float = 300) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.pid() is None:
                raise TritonError(f"tritonserver exited during start-up.\n{self.log_tail()}")
            states = self.model_states()
            if states is not None and self.is_ready():
                missing = [m for m in (expected_models or []) if states.get(m) != "READY"]
                if not missing:
                    return states
            if time.monotonic() > deadline:
                raise TritonError(
                    f"tritonserver not ready after {timeout_s:.0f} s; model states: {states}\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def is_ready(self) -> bool:
        return http_json(f"{self.url}/v2/health/ready", timeout=2)[0] == 200

    def model_states(self) -> dict[str, str] | None:
        """{model: READY|UNAVAILABLE|LOADING...} from the repository index, None if unreachable."""
        status, index = http_json(f"{self.url}/v2/repository/index", method="POST", body=b"{}", timeout=5)
        if status != 200:
            return None
        return {entry["name"]: entry.get("state", "UNKNOWN") for entry in index or []}

    def stop(self) -> bool:
        """Stop the server and its stubs (also those a killed server left), remove their shared memory.
        True if any of it was running."""
        stopped = self.process.stop()
        for region in self.shm_regions():  # a server or stub killed outright leaves its regions
            region.unlink(missing_ok=True)
        return stopped

    def log_tail(self, lines: int = 40) -> str:
        return self.process.log_tail(lines)

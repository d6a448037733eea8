"""The docker runtime's containers, defined once: the build contexts, the image tags, compose.yaml.

`fab deploy` stages, on the controller, everything a host needs to run
Triton and the API in containers:

    build/                  the two images' build context (the Dockerfiles and what they COPY),
                            the same for every host
    containers-HOST/        that host's compose.yaml: both containers, their network, volumes,
                            ports and restart policies, and its GPUs if it has any

The second part depends on the host's GPUs, so the role playbooks/roles/triton_docker
writes it once gpu_preflight has read them (`python -m provision.runtimes.containers stage`,
run on the controller), with the images' build arguments for those GPUs (the
torch architectures they need, or a CPU build). It then copies both to the
host, builds the images that are missing (provision/host/image_build.py on the host:
a wheelhouse made by pip in the image's base with the host's pip settings, then
`docker build`) and runs `docker compose up`. Paths in compose.yaml
are relative to the deploy folder on the host (Compose resolves them against
the file's folder), so the file does not depend on where the host keeps it.

Image tags are a hash of what goes into each image: a second deploy with the
same inputs finds the images and builds nothing, a changed requirements file
or Dockerfile gives a new tag, a rebuild and a recreated container.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import yaml

from provision.config import PROJECT_ROOT
from provision.host.layout import LIB_DIR, TOKEN_FILE
from provision.host.tritonserver import MODEL_LOADING

# Where things are inside the containers.
MODELS_IN_CONTAINER = "/models"
WEIGHTS_IN_CONTAINER = "/weights"
HF_CACHE_IN_CONTAINER = "/cache/huggingface"
BENCH_IN_CONTAINER = "/app/bench"
LIB_IN_CONTAINER = "/app/lib"
# The service of `fab bench --cluster`'s clients: not started by `up` (a Compose profile of its
# own), run once per bench with `docker compose run`.
CLIENTS_SERVICE = "clients"
TOKEN_SECRET = "jupyter_token"

# The files of each image's build context, relative to the project root
# (the Dockerfiles COPY them by these paths; the constraints files come from the settings).
TRITON_CONTEXT = ("Dockerfile.triton", "model_repository/requirements.txt", "provision/torch_arches.py")
API_CONTEXT = ("Dockerfile.api", "client_scripts")
# What pip downloads into each image's wheelhouse (context/wheels/NAME, which the
# Dockerfile mounts for its one `pip install --no-index`).
API_REQUIREMENTS = "client_scripts/requirements-container.txt"
TRITON_REQUIREMENTS = "model_repository/requirements.txt"


def _docker(settings: dict) -> dict:
    return settings["docker"]


def torch_pins(settings: dict, gpu_capabilities: list[str]) -> tuple[str, str]:
    """(constraints file, torch index) of the Triton image: the GPU build, or the CPU host's."""
    docker = _docker(settings)
    if gpu_capabilities:
        return docker["constraints"], docker["torch_index"]
    return docker["cpu_constraints"], docker["cpu_torch_index"]


def stage_build_context(settings: dict, destination: Path) -> None:
    """Copy what both Dockerfiles need into destination/, keeping the project's layout.

    The context is the same for every host: it holds the constraints of both
    torch builds, and each host's build arguments pick one.
    """
    shutil.rmtree(destination, ignore_errors=True)
    docker = _docker(settings)
    files = [*TRITON_CONTEXT, docker["constraints"], docker["cpu_constraints"], *API_CONTEXT]
    for relative in dict.fromkeys(files):
        source = PROJECT_ROOT / relative
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints"))
        else:
            shutil.copy2(source, target)


def required_torch_arches(gpu_capabilities: list[str]) -> str:
    """The architectures the torch build must have for these GPUs: ["6.0", "6.0"] -> "sm_60"; none: ""."""
    return " ".join(sorted({"sm_" + capability.replace(".", "") for capability in gpu_capabilities}))


def build_args(settings: dict, gpu_capabilities: list[str]) -> dict[str, dict[str, str]]:
    """The --build-arg values of each image, for a host whose GPUs have these compute capabilities.

    Every ARG the Dockerfiles declare is passed (tests/test_containers.py
    checks it), so no Dockerfile default silently decides for a host.
    """
    docker = _docker(settings)
    constraints, _ = torch_pins(settings, gpu_capabilities)
    return {
        "triton": {
            "TRITON_IMAGE": docker["triton_image"],
            "CONSTRAINTS": constraints,
            "REQUIRED_TORCH_ARCH": required_torch_arches(gpu_capabilities),
        },
        "api": {"PYTHON_IMAGE": docker["python_image"]},
    }


def _hash(root: Path, relatives: list[str], args: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for relative in relatives:
        path = root / relative
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes() + b"\0")
    for key, value in sorted(args.items()):
        digest.update(f"{key}={value}\0".encode())
    return digest.hexdigest()[:12]


def wheelhouse_downloads(settings: dict, gpu_capabilities: list[str]) -> dict[str, list[str]]:
    """The `pip download` arguments of each image's wheelhouse (paths relative to the build context)."""
    constraints, torch_index = torch_pins(settings, gpu_capabilities)
    triton = ["-r", TRITON_REQUIREMENTS, "-c", constraints]
    if torch_index:
        triton += ["--extra-index-url", torch_index]
    return {"triton": triton, "api": ["-r", API_REQUIREMENTS]}


def images(settings: dict, context: Path, gpu_capabilities: list[str]) -> dict[str, dict]:
    """Each image for a staged build context and a host's GPUs, as provision/host/image_build.py builds it.

    {"triton": {"name", "tag", "base", "dockerfile", "wheelhouse", "pip_download", "build_command"}, "api": {...}}
    """
    docker = _docker(settings)
    args = build_args(settings, gpu_capabilities)
    downloads = wheelhouse_downloads(settings, gpu_capabilities)
    bases = {"triton": docker["triton_image"], "api": docker["python_image"]}
    inputs = {
        "triton": [*TRITON_CONTEXT, torch_pins(settings, gpu_capabilities)[0]],
        "api": list(API_CONTEXT),
    }
    found = {}
    for name in ("triton", "api"):
        # The wheelhouse's inputs are part of the tag: another torch index is another image.
        tag = f"{docker['project']}/{name}:{_hash(context, inputs[name], args[name] | {'pip': ' '.join(downloads[name])})}"
        arg_flags = [f"--build-arg={key}={value}" for key, value in args[name].items()]
        found[name] = {
            "name": name,
            "tag": tag,
            "base": bases[name],
            "dockerfile": f"Dockerfile.{name}",
            "wheelhouse": f"wheels/{name}",
            "pip_download": downloads[name],
            # Run in the build context folder on the host.
            "build_command": ["docker", "build", "--file", f"Dockerfile.{name}", "--tag", tag, *arg_flags, "."],
        }
    return found


def compose_definition(settings: dict, image_tags: dict[str, str], bind_address: str, gpu_count: int) -> dict:
    """compose.yaml as a dict for one host: what runs, where it listens, what it mounts.

    The GPU parts (the device request, the memlock limit) only where there are
    GPUs: an engine without the NVIDIA runtime refuses the device request, and
    one that may not raise the hard memlock limit refuses the container.
    """
    ports = settings["ports"]

    def published(*names: str) -> list[str]:
        # bind_address 127.0.0.1 by default: bare-metal sites have no security
        # groups, a port published on every address is open to the internet.
        return [f"{bind_address}:{ports[name]}:{ports[name]}" for name in names]

    triton = _triton_service(_docker(settings), ports, image_tags["triton"], published, gpu_count)
    api = _api_service(ports, image_tags["api"], published)
    # The project's name comes from COMPOSE_PROJECT_NAME in .env (the role writes it):
    # every Compose release reads that, older ones reject a top-level `name:`.
    return {
        "services": {"triton": triton, "api": api, CLIENTS_SERVICE: _clients_service(image_tags["api"], api["user"])},
        "networks": {"lab": {"name": _docker(settings)["project"], "driver": "bridge"}},
        "secrets": {TOKEN_SECRET: {"file": f"./{TOKEN_FILE}"}},
    }


def _triton_service(docker: dict, ports: dict, image: str, published, gpu_count: int) -> dict:
    """Triton's service: the model repository and weights mounted, every GPU where there are GPUs."""
    triton = {
        "image": image,
        "command": [
            "tritonserver",
            f"--model-repository={MODELS_IN_CONTAINER}",
            f"--http-port={ports['triton_http']}",
            f"--grpc-port={ports['triton_grpc']}",
            f"--metrics-port={ports['triton_metrics']}",
            "--exit-timeout-secs=10",
            *MODEL_LOADING,
        ],
        "environment": {
            "HF_HOME": HF_CACHE_IN_CONTAINER,  # BLIP from the hub is downloaded once, kept on the host
            "TRITON_HTTP_PORT": str(ports["triton_http"]),  # the image's health check
        },
        "volumes": [
            # Mounted, not baked in: a config or weights change is a restart, not a rebuild.
            f"./models:{MODELS_IN_CONTAINER}:ro",
            f"./weights:{WEIGHTS_IN_CONTAINER}:ro",
            f"./cache/huggingface:{HF_CACHE_IN_CONTAINER}",
        ],
        "ports": published("triton_http", "triton_grpc", "triton_metrics"),
        # The Python backend moves every tensor through /dev/shm (Docker's 64 MB is too small).
        "shm_size": docker["shm_size"],
        "networks": ["lab"],
        "restart": "unless-stopped",
    }
    if gpu_count > 0:
        # Every GPU, with memlock and stack as NVIDIA recommends for its framework containers.
        triton["ulimits"] = {"memlock": -1, "stack": 67108864}
        triton["deploy"] = {
            "resources": {"reservations": {"devices": [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}}
        }
    return triton


def _api_service(ports: dict, image: str, published) -> dict:
    """The API and Jupyter's service: Triton by its name on the project's network, the bench folder mounted."""
    return {
        "image": image,
        # The login user's uid/gid (.env, written by the role): bench results and the
        # token file stay the user's.
        "user": "${LAB_UID:?}:${LAB_GID:?}",
        "environment": {
            # Triton by its service name on the user-defined network (localhost would be this container).
            "TRITON_URL": f"triton:{ports['triton_http']}",
            "TRITON_METRICS_URL": f"http://triton:{ports['triton_metrics']}/metrics",
            "JUPYTER_TOKEN_FILE": f"/run/secrets/{TOKEN_SECRET}",
            "API_PORT": str(ports["api"]),
            "JUPYTER_PORT": str(ports["jupyter"]),
            "HOME": "/tmp",
        },
        "secrets": [TOKEN_SECRET],
        "volumes": [f"./bench:{BENCH_IN_CONTAINER}", "./results:/app/results"],
        "ports": published("api", "jupyter"),
        "depends_on": ["triton"],
        "networks": ["lab"],
        "restart": "unless-stopped",
    }


def _clients_service(image: str, user: str) -> dict:
    """fab bench --cluster's perf_analyzer clients: the API image (its perf_analyzer) on the host's
    network, since the balancer listens on the host's loopback, which the API container's is not."""
    return {
        "image": image,
        "profiles": [CLIENTS_SERVICE],
        # The command `docker compose run` is given, as it is (the image's entrypoint starts the API).
        "entrypoint": ["env"],
        "user": user,
        "environment": {"PYTHONPATH": LIB_IN_CONTAINER, "HOME": "/tmp"},  # provision.host.side_by_side
        "volumes": [f"./bench:{BENCH_IN_CONTAINER}", f"./{LIB_DIR}:{LIB_IN_CONTAINER}:ro"],
        "network_mode": "host",
    }


def write_compose(path: Path, definition: dict) -> Path:
    header = "# Written by `fab deploy` (provision/runtimes/containers.py): edit that, not this file.\n"
    path.write_text(header + yaml.safe_dump(definition, sort_keys=False, width=120))
    return path


def stage_for_host(
    settings: dict, context: Path, destination: Path, gpu_capabilities: list[str], bind_address: str
) -> dict:
    """One host's compose.yaml in destination/, for its GPUs (the preflight's answer); returns its images."""
    found = images(settings, context, gpu_capabilities)
    tags = {name: image["tag"] for name, image in found.items()}
    destination.mkdir(parents=True, exist_ok=True)
    write_compose(destination / "compose.yaml", compose_definition(settings, tags, bind_address, len(gpu_capabilities)))
    return found


def main(argv: list[str] | None = None) -> int:
    """Run by the triton_docker role on the controller, once the preflight has read the host's GPUs."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    stage = commands.add_parser("stage", help="write DEST/compose.yaml for one host; print its images as JSON")
    stage.add_argument("destination", type=Path)
    stage.add_argument("--context", type=Path, required=True, help="the staged build context")
    stage.add_argument("--gpu-capabilities", default="", help='the host\'s GPUs, e.g. "6.0,6.0"; empty: no GPU')
    stage.add_argument("--settings-json", required=True, help='{"docker": lab.docker, "ports": lab.ports}')
    stage.add_argument("--bind-address", required=True)
    args = parser.parse_args(argv)
    capabilities = [c for c in args.gpu_capabilities.split(",") if c.strip()]
    found = stage_for_host(
        json.loads(args.settings_json), args.context, args.destination, capabilities, args.bind_address
    )
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())

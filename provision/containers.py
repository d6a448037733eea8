"""The docker runtime's containers, defined once: the build contexts, the image tags, compose.yaml.

`fab deploy` stages, on the controller, everything a GPU host needs to run
Triton and the API in containers:

    build/            the two images' build context (the Dockerfiles and what they COPY)
    compose.yaml      both containers, their network, volumes, ports and restart policies

and the role playbooks/roles/triton_docker copies them to the host, builds the
images that are missing and runs `docker compose up`. Paths in compose.yaml
are relative to the deploy folder on the host (Compose resolves them against
the file's folder), so the file does not depend on where the host keeps it.

Image tags are a hash of what goes into each image: a second deploy with the
same inputs finds the images and builds nothing, a changed requirements file
or Dockerfile gives a new tag, a rebuild and a recreated container.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import yaml

from provision.config import PROJECT_ROOT
from provision.container_runtime import TOKEN_FILE_ON_HOST

# Where things are inside the containers.
MODELS_IN_CONTAINER = "/models"
WEIGHTS_IN_CONTAINER = "/weights"
HF_CACHE_IN_CONTAINER = "/cache/huggingface"
BENCH_IN_CONTAINER = "/app/bench"
TOKEN_SECRET = "jupyter_token"

# The files of each image's build context, relative to the project root
# (the Dockerfiles COPY them by these paths).
TRITON_CONTEXT = ("Dockerfile.triton", "model_repository/requirements.txt")
API_CONTEXT = ("Dockerfile.api", "client_scripts")


def _docker(settings: dict) -> dict:
    return settings["docker"]


def stage_build_context(settings: dict, destination: Path) -> None:
    """Copy what both Dockerfiles need into destination/, keeping the project's layout."""
    shutil.rmtree(destination, ignore_errors=True)
    files = [*TRITON_CONTEXT, _docker(settings)["constraints"], *API_CONTEXT]
    for relative in files:
        source = PROJECT_ROOT / relative
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints"))
        else:
            shutil.copy2(source, target)


def build_args(settings: dict) -> dict[str, dict[str, str]]:
    """The --build-arg values of each image."""
    docker = _docker(settings)
    return {
        "triton": {
            "TRITON_IMAGE": docker["triton_image"],
            "TORCH_INDEX": docker["torch_index"],
            "CONSTRAINTS": docker["constraints"],
        },
        "api": {},
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


def images(settings: dict, context: Path) -> dict[str, dict]:
    """{"triton": {"tag", "dockerfile", "build_command"}, "api": {...}} for a staged build context."""
    docker = _docker(settings)
    args = build_args(settings)
    inputs = {
        "triton": [*TRITON_CONTEXT, docker["constraints"]],
        "api": list(API_CONTEXT),
    }
    found = {}
    for name in ("triton", "api"):
        tag = f"{docker['project']}/{name}:{_hash(context, inputs[name], args[name])}"
        arg_flags = [f"--build-arg={key}={value}" for key, value in args[name].items()]
        found[name] = {
            "tag": tag,
            "dockerfile": f"Dockerfile.{name}",
            # Run in the build context folder on the host.
            "build_command": ["docker", "build", "--file", f"Dockerfile.{name}", "--tag", tag, *arg_flags, "."],
        }
    return found


def compose_definition(settings: dict, image_tags: dict[str, str], bind_address: str) -> dict:
    """compose.yaml as a dict: what runs, where it listens, what it mounts."""
    docker = _docker(settings)
    ports = settings["ports"]
    project = docker["project"]

    def published(*names: str) -> list[str]:
        # bind_address 127.0.0.1 by default: bare-metal sites have no security
        # groups, a port published on every address is open to the internet.
        return [f"{bind_address}:{ports[name]}:{ports[name]}" for name in names]

    triton = {
        "image": image_tags["triton"],
        "command": [
            "tritonserver",
            f"--model-repository={MODELS_IN_CONTAINER}",
            f"--http-port={ports['triton_http']}",
            f"--grpc-port={ports['triton_grpc']}",
            f"--metrics-port={ports['triton_metrics']}",
            "--exit-timeout-secs=10",
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
        # The Python backend moves every tensor through /dev/shm (Docker's 64 MB is too small);
        # memlock and stack as NVIDIA recommends for its framework containers.
        "shm_size": docker["shm_size"],
        "ulimits": {"memlock": -1, "stack": 67108864},
        "deploy": {"resources": {"reservations": {"devices": [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}}},
        "networks": ["lab"],
        "restart": "unless-stopped",
    }
    api = {
        "image": image_tags["api"],
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
    # The project's name comes from COMPOSE_PROJECT_NAME in .env (the role writes it):
    # every Compose release reads that, older ones reject a top-level `name:`.
    return {
        "services": {"triton": triton, "api": api},
        "networks": {"lab": {"name": project, "driver": "bridge"}},
        "secrets": {TOKEN_SECRET: {"file": f"./{TOKEN_FILE_ON_HOST}"}},
    }


def write_compose(path: Path, definition: dict) -> Path:
    header = "# Written by `fab deploy` (provision/containers.py): edit that, not this file.\n"
    path.write_text(header + yaml.safe_dump(definition, sort_keys=False, width=120))
    return path

"""The docker runtime's container definitions (provision/runtimes/containers.py) and the two Dockerfiles.

These check the definitions themselves, without an engine, and have a real
Compose implementation (Debian's docker-compose, which `make test` installs)
parse and resolve them; tests/test_docker_deploy.py builds and runs them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from provision.config import PROJECT_ROOT
from provision.config import settings as lab_settings
from provision.runtimes import containers

SETTINGS = lab_settings()
PORTS = SETTINGS["ports"]
# The containers' ports (a cluster's balancer runs on the host: role load_balancer).
SERVED_PORTS = ("triton_http", "triton_grpc", "triton_metrics", "api", "jupyter")
# The compute capabilities gpu_preflight reads on a node (provision/gpu_preflight.py).
P100_NODE = ["6.0", "6.0"]  # Chameleon's gpu_p100: 2 x P100
A100_NODE = ["8.0"] * 4
CPU_HOST: list[str] = []


@pytest.fixture
def staged(tmp_path) -> Path:
    """A deploy folder as the role leaves it on the host (compose.yaml, .env, the token, the build context)."""
    containers.stage_build_context(SETTINGS, tmp_path / "build")
    return tmp_path


def definition(staged: Path, bind_address: str = "127.0.0.1", gpus: list[str] = P100_NODE) -> dict:
    images = containers.images(SETTINGS, staged / "build", gpus)
    tags = {name: image["tag"] for name, image in images.items()}
    return containers.compose_definition(SETTINGS, tags, bind_address, len(gpus))


def resolved_by_compose(staged: Path, compose: dict) -> dict:
    """`docker-compose config`: the definition as Compose reads it, after validation and interpolation."""
    tool = shutil.which("docker-compose")
    assert tool, "docker-compose (Debian package) is missing: run `make test`, which installs it"
    containers.write_compose(staged / "compose.yaml", compose)
    (staged / ".env").write_text("COMPOSE_PROJECT_NAME=triton-lab\nLAB_UID=1000\nLAB_GID=1000\n")
    (staged / "run").mkdir(exist_ok=True)
    (staged / "run" / "jupyter.token").write_text("not-a-real-token\n")
    done = subprocess.run([tool, "config"], cwd=staged, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def test_compose_accepts_the_definition_and_resolves_mounts_against_the_deploy_folder(staged):
    resolved = resolved_by_compose(staged, definition(staged))
    triton, api = resolved["services"]["triton"], resolved["services"]["api"]
    mounts = {target: (source, mode) for source, target, *mode in (v.split(":") for v in triton["volumes"])}
    assert mounts["/models"] == (str(staged / "models"), ["ro"])
    assert mounts["/weights"] == (str(staged / "weights"), ["ro"])
    assert mounts["/cache/huggingface"] == (str(staged / "cache" / "huggingface"), ["rw"])
    assert api["user"] == "1000:1000", "the API runs as the login user (.env)"
    assert resolved["secrets"]["jupyter_token"]["file"] == str(staged / "run" / "jupyter.token")


def test_the_cluster_bench_clients_are_the_api_image_on_the_host_network_and_not_started_by_up(staged):
    compose = definition(staged)
    resolved = resolved_by_compose(staged, compose)["services"]["clients"]
    assert resolved["image"] == compose["services"]["api"]["image"], "the API image: its perf_analyzer"
    assert resolved["network_mode"] == "host", "the balancer listens on the host's loopback"
    assert resolved["profiles"] == ["clients"], "`docker compose up` leaves it alone; `run` starts it"
    assert resolved["user"] == "1000:1000"
    assert resolved["entrypoint"] == ["env"], "runs the command it is given, not the API's entrypoint"
    mounts = {target: source for source, target, *_ in (v.split(":") for v in resolved["volumes"])}
    assert mounts == {"/app/bench": str(staged / "bench"), "/app/lib": str(staged / "lib")}
    assert resolved["environment"]["PYTHONPATH"] == "/app/lib", "python -m provision.host.side_by_side"


def test_triton_gets_every_gpu_enough_shared_memory_and_a_restart_policy(staged):
    triton = definition(staged)["services"]["triton"]
    assert triton["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
    ]
    assert triton["shm_size"] == SETTINGS["docker"]["shm_size"] == "4g"
    assert triton["ulimits"]["memlock"] == -1
    assert triton["restart"] == "unless-stopped"
    assert triton["environment"]["HF_HOME"] == "/cache/huggingface", "BLIP downloads are kept on the host"
    assert f"--http-port={PORTS['triton_http']}" in triton["command"]
    assert f"--metrics-port={PORTS['triton_metrics']}" in triton["command"]


def test_a_host_without_gpus_gets_no_device_request_and_no_memlock_limit(staged):
    # An engine without the NVIDIA runtime refuses the device request ("could not select device
    # driver nvidia"), and one that may not raise the hard memlock limit refuses the container.
    triton = definition(staged, gpus=CPU_HOST)["services"]["triton"]
    assert "deploy" not in triton and "ulimits" not in triton
    assert triton["shm_size"] == "4g" and triton["restart"] == "unless-stopped"
    resolved_by_compose(staged, definition(staged, gpus=CPU_HOST))


def test_both_containers_share_a_user_defined_network_and_the_api_finds_triton_by_name(staged):
    compose = definition(staged)
    assert compose["networks"]["lab"] == {"name": "triton-lab", "driver": "bridge"}
    for service in (compose["services"]["triton"], compose["services"]["api"]):
        assert service["networks"] == ["lab"] and service["restart"] == "unless-stopped"
    api = compose["services"]["api"]
    assert api["environment"]["TRITON_URL"] == f"triton:{PORTS['triton_http']}", "not localhost: another container"
    assert api["environment"]["JUPYTER_TOKEN_FILE"] == "/run/secrets/jupyter_token"
    assert "JUPYTER_TOKEN" not in api["environment"], "the token is a secret file, never in the definition"


def test_every_port_is_bound_to_127_0_0_1_unless_published(staged):
    private = definition(staged)
    ports = [port for service in private["services"].values() for port in service.get("ports", [])]
    assert sorted(ports) == sorted(f"127.0.0.1:{port}:{port}" for name, port in PORTS.items() if name in SERVED_PORTS)
    published = definition(staged, bind_address="0.0.0.0")
    assert all(port.startswith("0.0.0.0:") for s in published["services"].values() for port in s.get("ports", []))


def test_the_ports_come_from_the_one_place_that_knows_them(staged):
    settings = {**SETTINGS, "ports": {name: port + 1000 for name, port in PORTS.items()}}
    images = containers.images(settings, staged / "build", P100_NODE)
    compose = containers.compose_definition(settings, {n: i["tag"] for n, i in images.items()}, "127.0.0.1", 2)
    triton, api = compose["services"]["triton"], compose["services"]["api"]
    assert "127.0.0.1:9000:9000" in triton["ports"] and "--http-port=9000" in triton["command"]
    assert api["environment"]["TRITON_URL"] == "triton:9000"
    assert api["environment"]["API_PORT"] == "9080" and "127.0.0.1:9888:9888" in api["ports"]


def test_image_tags_change_exactly_when_an_images_inputs_change(staged):
    def tags(settings=SETTINGS, gpus=P100_NODE):
        return {name: image["tag"] for name, image in containers.images(settings, staged / "build", gpus).items()}

    before = tags()
    assert tags() == before, "same inputs, same tags: nothing to rebuild"
    requirements = staged / "build" / "model_repository" / "requirements.txt"
    requirements.write_text(requirements.read_text() + "\n# changed\n")
    after = tags()
    assert after["triton"] != before["triton"] and after["api"] == before["api"]
    (staged / "build" / "client_scripts" / "api.py").write_text("# changed\n")
    assert tags()["api"] != before["api"]
    other_base = {**SETTINGS, "docker": {**SETTINGS["docker"], "triton_image": "nvcr.io/nvidia/tritonserver:24.09-py3"}}
    assert tags(other_base)["triton"] != after["triton"]
    # Other GPUs, other build arguments: an image built for a P100 is not reused on an A100 or a CPU host.
    assert len({tags(gpus=gpus)["triton"] for gpus in (P100_NODE, A100_NODE, CPU_HOST)}) == 3
    assert tags(gpus=["6.0"]) == tags(gpus=P100_NODE), "the same kind of GPU, the same image"


def declared_args(dockerfile: str) -> set[str]:
    """The names of the ARGs a Dockerfile declares."""
    text = (PROJECT_ROOT / dockerfile).read_text()
    return set(re.findall(r"^ARG (\w+)", text, flags=re.MULTILINE))


def build_command_args(command: list[str]) -> dict[str, str]:
    return dict(flag.removeprefix("--build-arg=").split("=", 1) for flag in command if flag.startswith("--build-arg="))


CU126 = ["--extra-index-url", "https://download.pytorch.org/whl/cu126"]


@pytest.mark.parametrize(
    ("host", "gpus", "expected", "wheels"),
    [
        ("P100 node", P100_NODE, {"CONSTRAINTS": "constraints/p100.txt", "REQUIRED_TORCH_ARCH": "sm_60"}, CU126),
        ("A100 node", A100_NODE, {"CONSTRAINTS": "constraints/p100.txt", "REQUIRED_TORCH_ARCH": "sm_80"}, CU126),
        # pip's own index (and the host's pip settings, which image_build.py hands in).
        ("CPU host", CPU_HOST, {"CONSTRAINTS": "constraints/local.txt", "REQUIRED_TORCH_ARCH": ""}, []),
    ],
)  # fmt: skip
def test_the_build_commands_pass_every_argument_each_dockerfile_declares(staged, host, gpus, expected, wheels):
    images = containers.images(SETTINGS, staged / "build", gpus)
    for name, image in images.items():
        command = image["build_command"]
        assert command[:4] == ["docker", "build", "--file", f"Dockerfile.{name}"] and command[-1] == "."
        passed = build_command_args(command)
        assert set(passed) == declared_args(f"Dockerfile.{name}"), f"{host}: {name} build arguments"
        # The wheelhouse the Dockerfile mounts is the one image_build.py fills.
        assert f"source={image['wheelhouse']}," in (PROJECT_ROOT / image["dockerfile"]).read_text()
    triton = build_command_args(images["triton"]["build_command"])
    assert triton == {"TRITON_IMAGE": "nvcr.io/nvidia/tritonserver:24.10-py3", **expected}
    assert images["triton"]["pip_download"] == [
        "-r",
        "model_repository/requirements.txt",
        "-c",
        expected["CONSTRAINTS"],
        *wheels,
    ]
    assert images["triton"]["base"] == triton["TRITON_IMAGE"]
    assert build_command_args(images["api"]["build_command"]) == {"PYTHON_IMAGE": "python:3.11-slim-bookworm"}


def test_a_mixed_node_needs_the_kernels_of_each_of_its_gpus():
    assert containers.required_torch_arches(["7.0", "6.0", "7.0"]) == "sm_60 sm_70"


def _copy_sources(dockerfile: Path, build_args: dict) -> list[str]:
    sources = []
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY ") and "<<" not in line:
            words = [w for w in line.split()[1:] if not w.startswith("--")]
            sources += [re.sub(r"\$\{(\w+)\}", lambda m: build_args[m[1]], w) for w in words[:-1]]
    return sources


@pytest.mark.parametrize("gpus", [P100_NODE, CPU_HOST])
@pytest.mark.parametrize("image", ["triton", "api"])
def test_the_build_context_holds_everything_the_dockerfile_copies(staged, image, gpus):
    args = containers.build_args(SETTINGS, gpus)[image]
    dockerfile = staged / "build" / f"Dockerfile.{image}"
    sources = _copy_sources(dockerfile, args)
    assert sources, "the Dockerfile copies something"
    for source in sources:
        assert (staged / "build" / source.rstrip("/")).exists(), f"{source} is not in the build context"


def test_dockerfile_triton_pins_ngc_24_10_and_checks_the_wheel_not_the_build_machines_gpu():
    text = (PROJECT_ROOT / "Dockerfile.triton").read_text()
    assert f"ARG TRITON_IMAGE={SETTINGS['docker']['triton_image']}" in text
    assert f"ARG CONSTRAINTS={SETTINGS['docker']['constraints']}" in text
    assert "ARG REQUIRED_TORCH_ARCH=sm_60" in text
    assert 'torch_arches.py build --require "${REQUIRED_TORCH_ARCH}"' in text
    assert "torch.cuda.get_arch_list()" not in text.split("RUN", 1)[1], "it answers [] without a GPU in torch 2.7"
    assert "HEALTHCHECK" in text and "/v2/health/ready" in text
    assert "model_repository/requirements.txt" in text, "the one list of serving requirements"


@pytest.mark.parametrize("dockerfile", ["Dockerfile.triton", "Dockerfile.api"])
def test_the_dockerfiles_stay_within_the_oldest_engine_the_docker_role_accepts(dockerfile):
    # Docker 20.10 (Debian 12's docker.io, the engine of tests/test_docker_deploy.py) has a
    # BuildKit that knows `RUN --mount` but not heredocs, and a `# syntax=` line would pull an image.
    defaults_file = PROJECT_ROOT / "playbooks" / "roles" / "docker" / "defaults" / "main.yml"
    assert yaml.safe_load(defaults_file.read_text())["docker_engine_min_version"] == "20.10"
    text = (PROJECT_ROOT / dockerfile).read_text()
    instructions = [line for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    assert not [line for line in instructions if "<<" in line], "heredocs need Docker >= 23"
    assert not re.search(r"^# *syntax *=", text, flags=re.MULTILINE | re.IGNORECASE)


@pytest.mark.parametrize(
    "listing",
    [
        # docker compose >= 2.21: one JSON object per line; older releases: one array.
        '{"Service":"triton","Name":"triton-lab-triton-1","State":"running","Health":"healthy"}\n'
        '{"Service":"api","Name":"triton-lab-api-1","State":"running","Health":""}\n',
        '[{"Service":"triton","Name":"triton-lab-triton-1","State":"running","Health":"healthy"},'
        '{"Service":"api","Name":"triton-lab-api-1","State":"running","Health":""}]\n',
    ],
)
def test_fab_status_reads_the_containers_from_either_compose_listing(tmp_path, monkeypatch, listing):
    from provision.host import container_runtime

    # A stand-in for the Docker CLI (no engine here), answering `docker compose --file F ps --all --format json`.
    (tmp_path / "bin").mkdir()
    (tmp_path / "listing.json").write_text(listing)
    docker = tmp_path / "bin" / "docker"
    docker.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\ncat {tmp_path}/listing.json\n')
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")

    found = container_runtime.containers(tmp_path / "deploy")
    assert found == {
        "triton": {"name": "triton-lab-triton-1", "state": "running", "health": "healthy"},
        "api": {"name": "triton-lab-api-1", "state": "running", "health": None},
    }
    assert (tmp_path / "argv").read_text().split() == [
        "compose", "--file", str(tmp_path / "deploy" / "compose.yaml"), "ps", "--all", "--format", "json",
    ]  # fmt: skip

    # Nothing answers on these ports: the containers are listed, the services are not healthy.
    from provision.host.background import free_ports

    ports = dict(zip(["triton_http", "triton_grpc", "triton_metrics", "api", "jupyter"], free_ports(5)))
    status = container_runtime.status(tmp_path / "deploy", "127.0.0.1", ports)
    assert status["triton"]["pid"] == "triton-lab-triton-1 running" and status["triton"]["ready"] is False
    assert status["api"]["healthy"] is False and status["jupyter"]["url"] == f"http://127.0.0.1:{ports['jupyter']}"

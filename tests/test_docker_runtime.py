"""The docker runtime's playbooks in check mode against a real sshd host, and its provisioning rules.

No Docker engine, GPU or registry here: `fab deploy --check` runs every role
(gpu_preflight, docker, nvidia_container_toolkit, triton_docker) over SSH in
Ansible's check mode, which reports what it would change and changes nothing.
The GPUs are those of recorded nvidia-smi answers (tests/data/nvidia_smi/),
served by a stand-in nvidia-smi on the host: the one thing faked is the driver.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
from pathlib import Path

import pytest
from support.observing import changed_tasks

RECORDED = Path(__file__).parent / "data" / "nvidia_smi"
APT_LISTS = (Path("/etc/apt/sources.list.d/docker.list"), Path("/etc/apt/sources.list.d/nvidia-container-toolkit.list"))


def stand_in_nvidia_smi(folder: Path, case: str) -> Path:
    """An executable that answers like nvidia-smi did on a recorded host."""
    answer = json.loads((RECORDED / f"{case}.json").read_text())
    (folder / f"{case}.stdout").write_text(answer["stdout"])
    (folder / f"{case}.stderr").write_text(answer["stderr"])
    script = folder / f"nvidia-smi-{case}"
    script.write_text(f"#!/bin/sh\ncat {folder}/{case}.stdout\ncat {folder}/{case}.stderr >&2\nexit {answer['rc']}\n")
    script.chmod(0o755)
    return script


def stand_in_pci_bus(folder: Path, nvidia_gpus: int) -> Path:
    """A /sys/bus/pci/devices with a network card and `nvidia_gpus` NVIDIA display controllers."""
    devices = {"0000:00:03.0": ("0x8086", "0x020000")}
    devices |= {f"0000:{0x81 + n:02x}:00.0": ("0x10de", "0x030200") for n in range(nvidia_gpus)}
    for address, (vendor, device_class) in devices.items():
        (folder / "pci" / address).mkdir(parents=True)
        (folder / "pci" / address / "vendor").write_text(vendor + "\n")
        (folder / "pci" / address / "class").write_text(device_class + "\n")
    return folder / "pci"


class _AptServers(http.server.BaseHTTPRequestHandler):
    """Docker's and NVIDIA's download servers (unreachable from here): apt keys at their paths."""

    requested: list[str] = []

    def do_HEAD(self):  # get_url asks with HEAD in check mode
        type(self).requested.append(self.path)
        known = self.path in ("/docker/linux/debian/gpg", "/nvidia/gpgkey")
        self.send_response(200 if known else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def apt_servers(lab):
    """Point the roles at a local stand-in for download.docker.com and nvidia.github.io."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AptServers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    lab.extra_env["FABRIC_LAB_DOCKER_DOCKER_APT_BASE_URL"] = f"{base}/docker/linux"
    lab.extra_env["FABRIC_LAB_DOCKER_NVIDIA_APT_BASE_URL"] = f"{base}/nvidia"
    _AptServers.requested = []
    yield _AptServers.requested
    server.shutdown()


def provision_docker_host(lab, sshd) -> None:
    lab.fab(
        "provision", "--target", "ssh", "--runtime", "docker", "--host", "127.0.0.1", "--port", str(sshd.port),
        "--user", sshd.user, "--key", str(sshd.key), "--python", "/usr/bin/python3",
    )  # fmt: skip


@pytest.mark.deploy
def test_deploy_in_check_mode_walks_every_role_on_a_p100_host_and_changes_nothing(lab, sshd, tmp_path, apt_servers):
    provision_docker_host(lab, sshd)
    assert lab.state()["runtime"] == "docker"
    lab.extra_env["FABRIC_LAB_DOCKER_NVIDIA_SMI"] = str(stand_in_nvidia_smi(tmp_path, "p100"))
    lab.extra_env["FABRIC_LAB_DOCKER_PCI_DEVICES_DIR"] = str(stand_in_pci_bus(tmp_path, nvidia_gpus=2))
    apt_lists_before = {path: path.exists() for path in APT_LISTS}

    dry = lab.fab("deploy", "--check")
    output = dry.stdout
    assert re.search(r"check mode: \d+ change\(s\) would be made; nothing was changed", output)
    would_change = changed_tasks(output)
    for task in (
        "Add Docker's apt repository",
        "Add NVIDIA's apt repository",
        "Use the cgroupfs driver, so that containers keep their GPUs across daemon reloads",
        "Copy the container definitions",
        "Make the Jupyter token (only on the host, readable by the login user only)",
    ):
        assert any(line.startswith(task) for line in would_change), f"{task!r} not reported:\n{output}"
    # Packages of a repository that check mode did not add cannot be found: said, not hidden.
    assert "ignored  127.0.0.1     Install Docker (No package matching 'docker-ce' is available)" in output
    assert "Install the NVIDIA container toolkit (No package matching 'nvidia-container-toolkit'" in output
    # Commands that would build, start or configure are skipped by check mode, and listed.
    for task in ("Register the NVIDIA runtime with Docker", "Build the missing images", "Start the containers"):
        assert f"skipped  127.0.0.1     {task}" in output
    assert apt_servers == ["/docker/linux/debian/gpg", "/nvidia/gpgkey"], "both apt keys were looked up"

    # Nothing changed on the host, nor in the state.
    assert {path: path.exists() for path in APT_LISTS} == apt_lists_before
    assert not (lab.root / "deploy-remote").exists()
    assert lab.state()["deploy"] == {}, "a dry run records no deployment"

    # The repository was rendered for the host's two P100s, with the containers' paths.
    rendered = lab.state_file.parent / "bundle" / "models-127.0.0.1"
    multigpu = (rendered / "multigpu_food_classifier" / "config.pbtxt").read_text()
    assert multigpu.count("kind: KIND_GPU") == 2 and "gpus: [ 0 ]" in multigpu and "gpus: [ 1 ]" in multigpu
    single = (rendered / "gpu_food_classifier" / "config.pbtxt").read_text()
    assert single.count("kind: KIND_GPU") == 1 and "gpus: [ 0 ]" in single
    assert '"/weights/food11.pth"' in single

    # The compose file staged for the host binds every port to 127.0.0.1 and asks for its GPUs,
    # and the Triton image is built for them: the build checks the wheel for sm_60.
    compose = (lab.state_file.parent / "bundle" / "containers-127.0.0.1" / "compose.yaml").read_text()
    assert "0.0.0.0" not in compose and compose.count("127.0.0.1:") == 5
    assert "driver: nvidia" in compose
    from provision.config import settings as lab_settings
    from provision.runtimes import containers

    for_p100s = containers.images(lab_settings(), lab.state_file.parent / "bundle" / "build", ["6.0", "6.0"])["triton"]
    assert f"image: {for_p100s['tag']}" in compose
    assert "--build-arg=REQUIRED_TORCH_ARCH=sm_60" in for_p100s["build_command"]


@pytest.mark.parametrize(
    ("case", "message"),
    [("none", "the NVIDIA driver sees no GPU"), ("driver_missing", "no NVIDIA driver on this host")],
)
def test_the_gpu_preflight_stops_a_gpu_host_with_a_broken_driver_before_anything_is_installed(
    lab, sshd, tmp_path, case, message
):
    provision_docker_host(lab, sshd)
    lab.extra_env["FABRIC_LAB_DOCKER_PCI_DEVICES_DIR"] = str(stand_in_pci_bus(tmp_path, nvidia_gpus=2))
    lab.extra_env["FABRIC_LAB_DOCKER_NVIDIA_SMI"] = (
        str(stand_in_nvidia_smi(tmp_path, case)) if case != "driver_missing" else str(tmp_path / "no-nvidia-smi")
    )
    failed = lab.fab("deploy", "--check", check=False)
    assert failed.returncode != 0
    assert "GPU preflight on 127.0.0.1" in failed.stdout + failed.stderr
    assert message in failed.stdout + failed.stderr
    assert "Add Docker's apt key" not in failed.stdout, "nothing after the preflight runs"


@pytest.mark.deploy
def test_a_host_without_gpus_gets_cpu_images_and_no_nvidia_toolkit(lab, sshd, tmp_path, apt_servers):
    provision_docker_host(lab, sshd)
    lab.extra_env["FABRIC_LAB_DOCKER_PCI_DEVICES_DIR"] = str(stand_in_pci_bus(tmp_path, nvidia_gpus=0))
    lab.extra_env["FABRIC_LAB_DOCKER_NVIDIA_SMI"] = str(tmp_path / "no-nvidia-smi")
    dry = lab.fab("deploy", "--check")
    assert "no GPU: CPU images" in dry.stdout
    assert "NVIDIA container toolkit skipped: no GPU on this host" in dry.stdout
    assert "Add NVIDIA's apt repository" not in dry.stdout
    compose = (lab.state_file.parent / "bundle" / "containers-127.0.0.1" / "compose.yaml").read_text()
    assert "driver: nvidia" not in compose and "memlock" not in compose


def test_the_local_target_takes_the_docker_runtime(lab):
    done = lab.fab("provision", "--target", "local", "--runtime", "docker")
    assert "docker runtime" in done.stdout and lab.state()["runtime"] == "docker"
    again = lab.fab("provision", "--target", "local", "--runtime", "docker")
    assert "already provisioned: nothing to do" in again.stdout


def test_an_unknown_runtime_is_refused(lab, sshd):
    refused = lab.fab(
        "provision", "--target", "ssh", "--runtime", "kubernetes", "--host", "127.0.0.1", "--port", str(sshd.port),
        "--user", sshd.user, "--key", str(sshd.key), check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "unknown runtime 'kubernetes'" in refused.stderr


def test_teardown_of_a_docker_host_that_never_deployed_verifies_and_forgets(lab, sshd, tmp_path):
    provision_docker_host(lab, sshd)
    lab.extra_env["FABRIC_LAB_DOCKER_NVIDIA_SMI"] = str(stand_in_nvidia_smi(tmp_path, "none"))
    lab.extra_env["FABRIC_LAB_DOCKER_PCI_DEVICES_DIR"] = str(stand_in_pci_bus(tmp_path, nvidia_gpus=2))
    lab.fab("deploy", check=False)  # stops at the preflight: the state says "in-progress"
    assert lab.state()["deploy"]["status"] == "in-progress"
    done = lab.fab("teardown")
    assert "teardown complete" in done.stdout
    assert lab.state() is None


def test_bench_measures_from_the_api_container_against_the_triton_container_with_gpu_metrics():
    from provision.config import settings as lab_settings
    from provision.measure import perf_runs
    from provision.runtimes import triton_endpoints

    settings = lab_settings()
    ports, quick = settings["ports"], settings["bench"]["quick"]
    docker = perf_runs(["food_classifier"], *triton_endpoints("docker", "127.0.0.1", ports), profile=quick)[0].command()
    assert docker[docker.index("-u") + 1] == f"triton:{ports['triton_http']}"
    assert "--collect-metrics" in docker and "--verbose-csv" in docker
    assert docker[docker.index("--metrics-url") + 1] == f"triton:{ports['triton_metrics']}/metrics"

    process = perf_runs(["food_classifier"], *triton_endpoints("process", "127.0.0.1", ports), profile=quick)[
        0
    ].command()
    assert process[process.index("-u") + 1] == f"127.0.0.1:{ports['triton_http']}"
    assert "--collect-metrics" not in process, "a CPU host's Triton serves no GPU metrics"

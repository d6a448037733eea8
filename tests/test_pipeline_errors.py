"""Bad input to the pipeline: one clear message that says what to do, and a state the next command can use."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest
from support.lab import assert_nothing_of_ours_is_left, new_lab

from provision.host.background import free_ports


def test_an_unknown_target_names_the_choices(tmp_path):
    done = new_lab(tmp_path).fab("provision", "--target", "openstack", check=False)
    assert done.returncode != 0
    assert "unknown target 'openstack': choose one of local, ssh, chameleon" in done.stderr


@pytest.mark.parametrize("task", ["deploy", "bench", "status", "logs", "tunnel"])
def test_tasks_that_need_a_target_say_which_command_to_run(tmp_path, task):
    done = new_lab(tmp_path).fab(task, check=False)
    assert done.returncode != 0 and "run `fab provision` first" in done.stderr


def test_an_unreachable_host_is_named_and_nothing_is_recorded(tmp_path, sshd):
    lab = new_lab(tmp_path)
    closed_port = free_ports(1)[0]
    done = lab.fab(
        "provision", "--target", "ssh", "--host", "127.0.0.1", "--port", str(closed_port), "--key", str(sshd.key),
        check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert f"127.0.0.1:{closed_port} refused the connection" in done.stderr
    assert lab.state() is None


def test_a_wrong_key_is_named(tmp_path, sshd):
    lab = new_lab(tmp_path)
    stranger = tmp_path / "stranger_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    done = lab.fab(
        "provision", "--target", "ssh", "--host", "127.0.0.1", "--port", str(sshd.port), "--user", sshd.user,
        "--key", str(stranger), check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert f"refused the key {stranger}" in done.stderr and "check --user and --key" in done.stderr
    assert lab.state() is None


def test_a_missing_key_file_is_named(tmp_path):
    done = new_lab(tmp_path).fab(
        "provision", "--target", "ssh", "--host", "127.0.0.1", "--key", "/no/such/key", check=False
    )
    assert done.returncode != 0 and "the key file /no/such/key does not exist" in done.stderr


def test_another_target_needs_a_teardown_first(lab, tmp_path, sshd):
    lab.fab("provision", "--target", "local")
    done = lab.fab("provision", "--target", "ssh", "--host", "127.0.0.1", check=False)
    assert done.returncode != 0 and "run `fab teardown` first" in done.stderr
    assert lab.fab("provision", "--target", "local").stdout.startswith("local target already provisioned")
    lab.fab("teardown")


def test_bench_before_deploy_says_to_deploy(lab, tmp_path):
    lab.fab("provision", "--target", "local")
    done = lab.fab("bench", "--quick", check=False)
    assert done.returncode != 0 and "nothing is deployed: run `fab deploy` first" in done.stderr
    lab.fab("teardown")


def test_tunnel_names_the_hosts_and_needs_a_deploy(lab, sshd):
    lab.fab("provision", "--target", "ssh", "--host", "127.0.0.1", "--port", str(sshd.port), "--user", sshd.user,
            "--key", str(sshd.key))  # fmt: skip
    unknown = lab.fab("tunnel", "--node", "3", check=False)
    assert unknown.returncode != 0 and "no host '3'; hosts: 127.0.0.1" in unknown.stderr
    undeployed = lab.fab("tunnel", check=False)
    assert undeployed.returncode != 0 and "nothing is deployed: run `fab deploy` first" in undeployed.stderr
    lab.fab("teardown")


@pytest.mark.deploy
def test_a_port_in_use_is_named_and_teardown_cleans_up(lab, tmp_path):
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", lab.ports["triton_http"]))
    squatter.listen()
    try:
        lab.fab("provision", "--target", "local")
        done = lab.fab("deploy", check=False)
        assert done.returncode != 0
        assert f"port(s) {lab.ports['triton_http']} (triton) already in use" in done.stderr
        assert f"{lab.ports['triton_http']} is held by pid {os.getpid()} (" in done.stderr, "who holds it"
        assert "task 'Check that no other program holds our ports' failed" in done.stderr
        assert "full log:" in done.stderr
        assert lab.state()["deploy"]["status"] == "in-progress"
    finally:
        squatter.close()
    assert "teardown complete" in lab.fab("teardown").stdout
    assert lab.state() is None and not (tmp_path / "deploy-local").exists()


@pytest.mark.deploy
def test_an_interrupted_deploy_continues_and_tears_down(lab, tmp_path):
    lab.fab("provision", "--target", "local")
    deploy = lab.popen_fab("deploy")
    # Interrupt once deploy is under way (its folders exist on the host).
    deadline = time.monotonic() + 120
    while not (tmp_path / "deploy-local" / "weights").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(deploy.pid, signal.SIGKILL)
    deploy.wait()
    assert lab.state()["deploy"]["status"] == "in-progress"

    resumed = lab.fab("deploy").stdout
    assert "deploy complete" in resumed
    assert lab.state()["deploy"]["status"] == "deployed"
    assert "teardown complete" in lab.fab("teardown").stdout
    assert_nothing_of_ours_is_left(lab, tmp_path / "deploy-local")


def test_a_missing_weights_file_stops_deploy_before_any_host_is_touched(lab, tmp_path):
    lab.fab("provision", "--target", "local")
    missing = tmp_path / "nowhere" / "food11.pth"
    done = lab.fab("deploy", check=False, env=lab.env() | {"FABRIC_LAB_FOOD11_WEIGHTS": str(missing)})
    assert done.returncode == 1
    assert done.stderr.strip() == f"error: lab.food11_weights (FABRIC_LAB_FOOD11_WEIGHTS) is {missing}: no such file"
    assert lab.state()["deploy"] == {}, "nothing was deployed, nothing is recorded as begun"
    lab.fab("teardown")

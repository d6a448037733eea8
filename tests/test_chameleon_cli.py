"""`fab` on the chameleon target, end to end against the fake OpenStack (real python-chi inside fab)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from support import fake_openstack
from support.fake_openstack import NODE_ADDRESSES, PUBLIC_KEY, FakeOpenStack, SSHBanner
from support.observing import printed_lines, read_until, the_rest
from support.sshd import start_sshd

from provision.config import PROJECT_ROOT
from provision.host.background import free_ports


@pytest.fixture
def cloud(lab, tmp_path):
    """The fake cloud, a node that answers SSH, and the lab's environment pointing at both."""
    fake = FakeOpenStack().start()
    banner = SSHBanner(NODE_ADDRESSES)
    public = tmp_path / "id_test.pub"
    public.write_text(PUBLIC_KEY + "\n")
    (tmp_path / "id_test").write_text("not a real private key\n")
    lab.extra_env.update(fake.env())
    lab.extra_env.update(
        {
            "FABRIC_LAB_CHAMELEON_PUBLIC_KEY": str(public),
            "FABRIC_LAB_CHAMELEON_SSH_PORT": str(banner.port),
            "FABRIC_LAB_CHAMELEON_POLL_INTERVAL_S": "0.05",
        }
    )
    yield fake
    banner.close()
    fake.stop()


def without_credentials(lab) -> dict:
    return {name: value for name, value in lab.env().items() if not name.startswith("OS_")}


def test_no_credentials_print_what_to_set(lab):
    os_free = without_credentials(lab)
    done = lab.fab("provision", "--target", "chameleon", check=False, env=os_free)
    assert done.returncode != 0
    for variable in (
        "OS_AUTH_URL",
        "OS_REGION_NAME",
        "OS_APPLICATION_CREDENTIAL_ID",
        "OS_APPLICATION_CREDENTIAL_SECRET",
    ):
        assert variable in done.stderr
    assert "Application Credentials" in done.stderr
    assert lab.state() is None, "nothing was created, so nothing is recorded"


def test_provision_status_extend_teardown(lab, cloud):
    provisioned = lab.fab("provision", "--target", "chameleon").stdout
    assert "node(s) ready: cc@127.0.0.10" in provisioned
    assert cloud.held() == {"leases": 1, "servers": 1, "floatingips": 1}
    state_text = lab.state_file.read_text()
    assert os.environ.get("OS_APPLICATION_CREDENTIAL_SECRET", "secret-never-stored") not in state_text
    assert cloud.env()["OS_APPLICATION_CREDENTIAL_SECRET"] not in state_text
    assert "already provisioned: nothing new was created" in lab.fab("provision", "--target", "chameleon").stdout
    assert cloud.held() == {"leases": 1, "servers": 1, "floatingips": 1}

    status = lab.fab("status").stdout
    assert "lease triton-lab-" in status and ": ACTIVE, ends " in status and "left)" in status
    assert "floating IP 127.0.0.10" in status
    assert lab.fab("extend", "--hours", "1").returncode == 0

    assert "teardown complete" in lab.fab("teardown").stdout
    assert cloud.held() == {"leases": 0, "servers": 0, "floatingips": 0}
    assert lab.state() is None



def test_make_demo_leaves_a_chameleon_node_the_user_provisioned(lab, cloud):
    """`make demo` ends with a teardown, so it runs as a user of its own (state, folders, ports): a student's
    node on Chameleon, provisioned before, is still there after it, and so is the state that records it."""
    lab.fab("provision", "--target", "chameleon")
    recorded = lab.state_file.read_text()
    missing = lab.root / "nowhere" / "food11.pth"  # the demo stops at its deploy, then tears down its own
    demo = subprocess.run(
        [sys.executable, "-m", "provision.demo"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600,
        env=lab.env() | {"FABRIC_LAB_FOOD11_WEIGHTS": str(missing)},
    )  # fmt: skip
    assert demo.returncode != 0
    assert f"lab.food11_weights (FABRIC_LAB_FOOD11_WEIGHTS) is {missing}: no such file" in demo.stderr
    assert "Traceback" not in demo.stderr
    assert "teardown complete" in demo.stdout, "the demo's own provision is released"
    assert cloud.held() == {"leases": 1, "servers": 1, "floatingips": 1}
    assert lab.state_file.read_text() == recorded
    assert "teardown complete" in lab.fab("teardown").stdout

@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_while_the_server_builds_says_what_exists_and_how_to_go_on(lab, cloud, stop):
    cloud.server_polls_to_active = 10**6  # BUILD until interrupted
    provision = lab.popen_fab("provision", "--target", "chameleon")
    try:
        deadline = time.monotonic() + 60
        while not (lab.state() and any(s.get("id") for s in lab.state()["chameleon"].get("servers", []))):
            assert time.monotonic() < deadline and provision.poll() is None, "the provision never got to the server"
            time.sleep(0.1)
        provision.send_signal(stop)
        output, _ = provision.communicate(timeout=30)
    finally:
        if provision.poll() is None:
            provision.kill()
    assert provision.returncode == 130
    assert "interrupted: on CHI@TACC: lease triton-lab-alice (" in output and "server triton-lab-alice-node1" in output
    assert "`fab provision --target chameleon` continues" in output and "`fab teardown` releases" in output
    assert "Traceback" not in output
    lab.fab("teardown")
    assert cloud.held() == {"leases": 0, "servers": 0, "floatingips": 0}


def test_teardown_releases_a_lease_whose_create_answer_was_lost(lab, cloud):
    cloud.fault("POST", r"/reservation/v1/leases", "lost")
    cloud.fault("GET", r"/reservation/v1/leases", 503, times=100, skip=1)  # and it cannot be checked now
    lab.extra_env["FABRIC_LAB_CHAMELEON_RETRY_FIRST_DELAY_S"] = "0.01"
    failed = lab.fab("provision", "--target", "chameleon", check=False)
    assert failed.returncode != 0 and "fab teardown" in failed.stderr
    assert cloud.held()["leases"] == 1 and lab.state() is not None, "the state keeps the lease's name"
    cloud.faults.clear()
    assert "teardown complete" in lab.fab("teardown").stdout
    assert cloud.held() == {"leases": 0, "servers": 0, "floatingips": 0}


@pytest.mark.deploy
def cloud_whose_node_is_this_machine(lab, key, ssh_port: int) -> FakeOpenStack:
    """A fake cloud whose node is this machine: its floating IP is 127.0.0.1, where an sshd of the
    tests listens on ssh_port and takes `key`; the lab's environment points at both."""
    fake = FakeOpenStack(floating_ips=["127.0.0.1"]).start()
    lab.extra_env.update(fake.env())
    lab.extra_env.update(
        {
            "FABRIC_LAB_CHAMELEON_PUBLIC_KEY": f"{key}.pub",
            "FABRIC_LAB_CHAMELEON_SSH_PORT": str(ssh_port),
            "FABRIC_LAB_CHAMELEON_POLL_INTERVAL_S": "0.05",
            # This machine's torch, not the P100 build a real node installs.
            "FABRIC_LAB_CHAMELEON_CONSTRAINTS": "constraints/local.txt",
            "FABRIC_LAB_CHAMELEON_PIP_EXTRA_ARGS": "",
        }
    )
    return fake


def test_a_lease_you_hold_is_deployed_to_and_benched_clear_of_its_end_and_left_at_teardown(lab, sshd):
    fake = cloud_whose_node_is_this_machine(lab, sshd.key, sshd.port)
    # The student's lease, booked in the dashboard, with 15 minutes left.
    booked = fake.book_lease("course-p100", hours=0.25)
    models = ["--model", "food_classifier", "--model", "batching_food_classifier"]
    try:
        provisioned = lab.fab(
            "provision", "--target", "chameleon", "--lease", "course-p100", "--runtime", "process", "--user",
            sshd.user, "--python", "/usr/bin/python3", "--serving-venv", sys.prefix,
        ).stdout  # fmt: skip
        assert f"using your lease course-p100 ({booked['id']}): 1 x gpu_p100, ACTIVE" in provisioned
        assert [path for method, path in fake.requests if method == "POST" and path.endswith("/leases")] == []
        lab.fab("deploy")
        status = lab.fab("status").stdout
        assert "lease course-p100 (yours: teardown leaves it) on CHI@TACC: ACTIVE" in status
        assert "warning: the lease ends in 0 h 1" in status

        refused = lab.fab("bench", "--quick", *models, check=False)
        assert refused.returncode == 1
        assert "would lose its results when the lease ends" in refused.stderr
        assert "Run `fab extend --hours 1` first, or bench less" in refused.stderr
        assert not lab.results_dir.exists() or not any(lab.results_dir.iterdir()), "a refused bench writes nothing"

        lab.fab("extend", "--hours", "1")
        bench = lab.popen_fab("bench", "--quick", *models)
        lines = printed_lines(bench)
        output = read_until(lines, "Make the perf_analyzer input from it", timeout_s=300)
        # While the first model is measured, the lease is cut short (by the web UI, another terminal).
        lease = next(iter(fake.leases.values()))
        lease["end_date"] = fake_openstack._now() + timedelta(minutes=15, seconds=5)
        output += the_rest(lines, timeout_s=600)
        assert bench.wait(timeout=60) == 1, output

        assert "would end inside the 15 min margin; stopping here" in output
        assert "not measured: batching_food_classifier" in output
        assert "`fab extend --hours 1`, then `fab bench --quick --model=batching_food_classifier`" in output
        (results,) = lab.results_dir.iterdir()
        summary = json.loads((results / "summary.json").read_text())
        assert list(summary["models"]) == ["food_classifier"]
        assert summary["partial"] == {"reason": "the lease ends soon", "not_measured": ["batching_food_classifier"]}
        assert (results / "PARTIAL.md").exists() and "**PARTIAL**" in (results / "report.md").read_text()
        host = results / "hosts" / "triton-lab-alice-node1"
        assert (host / "food_classifier.csv").exists() and (host / "host.json").exists()
        assert (host / "configs" / "batching_food_classifier.pbtxt").exists(), "the finish phase ran"
        assert not list((lab.root / "deploy-remote" / "bench").iterdir()), "the host's bench folder is removed"

        torn_down = lab.fab("teardown").stdout
        assert f"left your lease course-p100 ({booked['id']}) as it is" in torn_down
        assert fake.held() == {"leases": 1, "servers": 0, "floatingips": 0}, "the server and its address went"
    finally:
        if lab.state() is not None:
            lab.fab("teardown", "--purge", check=False)
        fake.stop()


def knows(known_hosts, entry: str) -> bool:
    """Whether known_hosts has a key for `entry` ("[address]:port"; its lines may be hashed)."""
    return subprocess.run(["ssh-keygen", "-F", entry, "-f", str(known_hosts)], capture_output=True).returncode == 0


def test_an_address_that_comes_back_with_another_host_key_is_reached(lab, tmp_path):
    # Floating IPs come back from a small pool: the next node behind one has a host key of its own.
    port = free_ports(1)[0]
    node = start_sshd(tmp_path / "node-a", port)
    fake = cloud_whose_node_is_this_machine(lab, node.key, port)
    provision = ["provision", "--target", "chameleon", "--runtime", "process", "--user", node.user,
                 "--python", "/usr/bin/python3", "--serving-venv", sys.prefix]  # fmt: skip
    known_hosts = lab.state_file.with_name("known_hosts")
    entry = f"[127.0.0.1]:{port}"
    try:
        lab.fab(*provision)
        # The first contact records the node's key, as the deploy's does (accept-new).
        subprocess.run(
            ["ssh", "-p", str(port), "-i", str(node.key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
             "-o", f"UserKnownHostsFile={known_hosts}", f"{node.user}@127.0.0.1", "true"],
            check=True, timeout=60,
        )  # fmt: skip
        recorded = known_hosts.read_text()
        assert knows(known_hosts, entry)

        done = lab.fab("teardown")
        assert "forgot the host key of 127.0.0.1 (the address went back to the cloud)" in done.stdout
        assert not knows(known_hosts, entry)

        # Another node behind the same address: a new host key. The old entry is back (a teardown
        # of an earlier version, another checkout): provision removes it before the first SSH.
        node.stop()
        node = start_sshd(tmp_path / "node-b", port)
        (tmp_path / "node-b" / "authorized_keys").write_text((tmp_path / "node-a" / "authorized_keys").read_text())
        known_hosts.write_text(recorded)
        provisioned = lab.fab(*provision)
        assert "forgot the old host key of 127.0.0.1 (an earlier node had this address)" in provisioned.stdout
        # fab ssh trusts host keys exactly as the deploy's Ansible does (the project's known_hosts, a new
        # address's key recorded, a changed key refused): it reaches the node, no "host key changed".
        reached = lab.fab("ssh", stdin="echo reached $(whoami)\n", check=False)
        assert reached.returncode == 0 and f"reached {node.user}" in reached.stdout, reached.stderr
        assert knows(known_hosts, entry), "the new node's key is recorded"
        lab.fab("teardown")
        assert fake.held() == {"leases": 0, "servers": 0, "floatingips": 0}
    finally:
        if lab.state() is not None:
            lab.fab("teardown", "--purge", check=False)
        node.stop()
        fake.stop()


def start_in(hours: float) -> str:
    """A --start value, this machine's local time."""
    from datetime import datetime

    return (datetime.now() + timedelta(hours=hours)).strftime("%Y-%m-%d %H:%M")


def test_a_lease_booked_ahead_is_waited_for_with_progress_then_launched_on(lab, cloud):
    lab.extra_env["FABRIC_LAB_CHAMELEON_PROGRESS_EVERY_S"] = "1"  # (an integer setting)
    provision = lab.popen_fab("provision", "--target", "chameleon", "--start", start_in(2), "--wait-for-start")
    lines = printed_lines(provision)
    try:
        output = read_until(lines, "waiting for lease triton-lab-alice to start")
        output += read_until(lines, "lease triton-lab-alice: still PENDING")  # a line while it waits
        assert cloud.held() == {"leases": 1, "servers": 0, "floatingips": 0}
        cloud.advance(hours=2)  # its start comes (the fake's clock), and the provision carries on
        output += the_rest(lines)
        provision.wait(timeout=30)
    finally:
        if provision.poll() is None:
            provision.kill()
    assert provision.returncode == 0, output
    assert "node(s) ready: cc@127.0.0.10" in output and "next: fab deploy" in output
    lab.fab("teardown")
    assert cloud.held() == {"leases": 0, "servers": 0, "floatingips": 0}


@pytest.mark.parametrize("release", [False, True], ids=["left-booked", "release-lease"])
def test_ctrl_c_while_fab_run_waits_for_its_lease_leaves_it_booked_unless_asked(lab, cloud, release):
    run = lab.popen_fab("run", "--target", "chameleon", "--start", start_in(3), *(["--release-lease"] * release))
    lines = printed_lines(run)
    try:
        output = read_until(lines, "waiting for lease triton-lab-alice to start")
        run.send_signal(signal.SIGINT)
        output += the_rest(lines, timeout_s=60)
        run.wait(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, output
    if release:
        assert "interrupted while waiting: deleting lease triton-lab-alice (booked from " in output
        assert cloud.held() == {"leases": 0, "servers": 0, "floatingips": 0} and lab.state() is None
    else:
        assert "the deployment was not started: lease triton-lab-alice (booked from " in output
        assert "stays booked; `fab provision --target chameleon` after its start continues" in output
        assert cloud.held()["leases"] == 1
        assert "booked ahead: the lease starts " in lab.fab("status").stdout
        refused = lab.fab("deploy", check=False)
        assert refused.returncode == 1 and "no host yet: lease triton-lab-alice (booked from " in refused.stderr
        lab.fab("teardown")
        assert cloud.held() == {"leases": 0, "servers": 0, "floatingips": 0}

"""The chameleon target against a fake OpenStack on 127.0.0.1, driven by the real python-chi.

python-chi gets the fake through the variables a user's openrc file sets
(OS_AUTH_URL, OS_APPLICATION_CREDENTIAL_ID/SECRET, OS_REGION_NAME, ...). The
"node" is reachable by SSH because the test listens on its floating IP (a
loopback address) and answers with an SSH banner.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from support import fake_openstack
from support.fake_openstack import NODE_ADDRESSES, PUBLIC_KEY, FakeOpenStack, SSHBanner

from provision import state as state_module
from provision.errors import UsageError
from provision.targets import chameleon as target
from provision.targets.chameleon.cloud import (
    ChameleonError,
    CredentialsError,
    LeaseNotUsable,
    NoHostsError,
    check_credentials,
)

ROOT = Path(__file__).resolve().parent.parent
@pytest.fixture(scope="module")
def ssh_node():
    banner = SSHBanner(NODE_ADDRESSES)
    yield banner
    banner.close()


@pytest.fixture
def fake(monkeypatch, tmp_path):
    cloud = FakeOpenStack().start()
    for name in list(os.environ):
        if name.startswith("OS_"):
            monkeypatch.delenv(name)
    for name, value in cloud.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LAB_STATE_FILE", str(tmp_path / "state.json"))
    yield cloud
    cloud.stop()


@pytest.fixture
def settings(tmp_path, ssh_node):
    public = tmp_path / "id_test.pub"
    public.write_text(PUBLIC_KEY + "\n")
    (tmp_path / "id_test").write_text("not a real private key\n")
    return {
        "chameleon": {
            "public_key": str(public),
            "ssh_port": ssh_node.port,
            "poll_interval_s": 0.01,
            "timeouts": {"lease_active_s": 10, "server_active_s": 10, "ssh_s": 0.5, "delete_s": 10},
            "retry": {"attempts": 4, "first_delay_s": 0.01, "max_delay_s": 0.05},
        }
    }


class Recorder:
    """The `say` and `save` callbacks of a task: messages kept, state written to LAB_STATE_FILE."""

    def __init__(self, fail_at_save: int | None = None):
        self.messages: list[str] = []
        self.saves = 0
        self.fail_at_save = fail_at_save

    def say(self, message: str) -> None:
        self.messages.append(message)

    def save(self, state) -> None:
        self.saves += 1
        if self.fail_at_save is not None and self.saves >= self.fail_at_save:
            raise KeyboardInterrupt(f"killed at save {self.saves}")  # as if the process died here
        state_module.save(state)

    @property
    def text(self) -> str:
        return "\n".join(self.messages)


def creates(fake: FakeOpenStack) -> list[tuple[str, str]]:
    """The requests that create something in the cloud."""
    return [(m, p) for m, p in fake.requests if m == "POST" and p.endswith(("/leases", "/servers", "/floatingips"))]


def provision(settings, options=None, recorder=None, state=None):
    recorder = recorder or Recorder()
    state = state if state is not None else state_module.load()
    return target.provision(settings, options or {}, state, recorder.save, recorder.say), recorder


def release_from_file(settings, recorder=None):
    """What `fab teardown` does: release what the state file records."""
    recorder = recorder or Recorder()
    state = state_module.load()
    if state is not None:
        target.release(state, settings, recorder.save, recorder.say)
    return state, recorder


ZERO = {"leases": 0, "servers": 0, "floatingips": 0}
ONE_EACH = {"leases": 1, "servers": 1, "floatingips": 1}


def test_happy_path_reserves_one_of_each_and_release_leaves_zero(fake, settings, tmp_path):
    fake.lease_polls_to_active = 2
    fake.server_polls_to_active = 3
    settings["chameleon"]["progress_every_s"] = 0  # a heartbeat line on every poll
    state, recorder = provision(settings)

    assert fake.held() == ONE_EACH
    assert len(creates(fake)) == 2  # the lease and the server; the floating IP comes with the lease
    [host] = state.hosts
    assert (host.user, host.port, host.connection) == ("cc", settings["chameleon"]["ssh_port"], "ssh")
    assert host.address in NODE_ADDRESSES
    assert host.key == str(tmp_path / "id_test")
    assert state.chameleon["lease"]["status"] == "ACTIVE"
    assert state.chameleon["servers"][0]["name"] == "triton-lab-alice-node1"  # derived from the Keystone user
    assert fake.keypairs["triton-lab-alice"]["public_key"] == PUBLIC_KEY
    # Progress: each status change with the elapsed time, not a silent wait.
    assert "lease triton-lab-alice: PENDING (" in recorder.text
    assert "server triton-lab-alice-node1: BUILD (" in recorder.text
    assert "server triton-lab-alice-node1: still BUILD (" in recorder.text and "elapsed)" in recorder.text
    assert "answers SSH (SSH-2.0-OpenSSH_9.6 fake)" in recorder.text
    # No credential is written to the state.
    written = Path(os.environ["LAB_STATE_FILE"]).read_text()
    assert fake_openstack.APP_CRED_SECRET not in written and fake_openstack.APP_CRED_ID not in written
    assert state_module.load().hosts == state.hosts

    _, recorder = release_from_file(settings)
    assert fake.held() == ZERO
    # A lease-reserved floating IP goes with its lease: never deallocated by us.
    assert not [p for m, p in fake.requests if m == "DELETE" and "/floatingips/" in p]
    left = state_module.load()
    assert left.hosts == [] and "lease" not in left.chameleon and left.chameleon["servers"] == []
    assert "verified" in recorder.text


def test_rerun_after_success_creates_nothing(fake, settings):
    first, _ = provision(settings)
    before = len(creates(fake))
    second, recorder = provision(settings)
    assert len(creates(fake)) == before
    assert fake.held() == ONE_EACH
    assert second.hosts == first.hosts
    assert "nothing new was created" in recorder.text
    release_from_file(settings)
    assert fake.held() == ZERO


def test_two_nodes_get_two_servers_and_two_addresses(fake, settings):
    fake.node_types["gpu_p100"] = 2
    fake.hosts.append({"id": "host-gpu_p100-1", "hypervisor_hostname": "gpu_p100-1", "node_type": "gpu_p100"})
    state, _ = provision(settings, {"count": 2})
    assert fake.held() == {"leases": 1, "servers": 2, "floatingips": 2}
    assert len({h.address for h in state.hosts}) == 2
    release_from_file(settings)
    assert fake.held() == ZERO


def test_no_free_node_says_what_to_do_at_this_site_and_holds_nothing(fake, settings):
    fake.hosts.append({"id": "host-nv", "hypervisor_hostname": "nv", "node_type": "gpu_p100_nvlink"})
    fake.hosts.append({"id": "host-cpu", "hypervisor_hostname": "cpu", "node_type": "compute_skylake"})
    busy_until = fake.block_hosts("gpu_p100", hours=5)
    with pytest.raises(NoHostsError) as caught:
        provision(settings)
    message = str(caught.value)
    assert "Not enough hosts available" in message and "later" in message
    assert "another node type here (--node-type gpu_p100_nvlink)" in message, "the site's other GPU nodes only"
    assert "book a slot ahead in the dashboard and work in it (fab provision --lease NAME)" in message
    assert "--site" not in message and "another site" not in message, "the P100s are at this site only"
    assert f"{busy_until:%Y-%m-%d %H:%M}" in message  # the next free slot, from Blazar's allocations
    assert caught.value.next_free is not None
    assert fake.held() == ZERO
    release_from_file(settings)
    assert fake.held() == ZERO


def test_lease_error_is_cleaned_up_and_reported_as_an_error_of_the_lease(fake, settings):
    fake.fail["lease_status"] = "ERROR"
    with pytest.raises(ChameleonError, match="went to ERROR") as caught:
        provision(settings)
    assert not isinstance(caught.value, NoHostsError), "an ERROR lease is not 'no node free'"
    assert "not a lack of free nodes" in str(caught.value) and "next free slot" not in str(caught.value)
    assert fake.held() == ZERO  # the failed lease was deleted and verified gone
    release_from_file(settings)
    assert fake.held() == ZERO


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        ({"server_status": "ERROR"}, "failed to deploy"),
        ({"fip_associate": True}, "attaching floating IP"),
        ("ssh", "did not answer SSH"),
    ],
    ids=["server-error", "floating-ip-failure", "ssh-unreachable"],
)
def test_failure_at_a_step_then_release_leaves_zero(fake, settings, failure, expected):
    if failure == "ssh":
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        settings["chameleon"]["ssh_port"] = closed.getsockname()[1]  # bound, never listening: refused
    else:
        fake.fail.update(failure)
    with pytest.raises(ChameleonError, match=expected) as caught:
        provision(settings)
    assert "fab teardown" in str(caught.value)
    assert fake.held()["leases"] == 1  # the lease is kept for a retry
    if failure == {"server_status": "ERROR"}:
        assert fake.held()["servers"] == 0  # the broken server was deleted
    release_from_file(settings)
    assert fake.held() == ZERO
    if failure == "ssh":
        closed.close()


def test_provision_continues_after_a_failed_step(fake, settings):
    fake.fail["fip_associate"] = True
    with pytest.raises(ChameleonError):
        provision(settings)
    fake.fail.clear()
    before = len(creates(fake))
    state, _ = provision(settings)
    assert len(creates(fake)) == before  # the same lease and server were used
    assert fake.held() == ONE_EACH and state.hosts
    release_from_file(settings)
    assert fake.held() == ZERO


def _saves_of_a_full_provision(settings) -> int:
    """How many times a full provision saves (measured on a fake of its own)."""
    other = FakeOpenStack().start()
    previous = {name: os.environ.get(name) for name in other.env()}
    os.environ.update(other.env())
    try:
        recorder = Recorder()
        target.provision(settings, {}, None, lambda state: setattr(recorder, "saves", recorder.saves + 1), recorder.say)
        return recorder.saves
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        other.stop()


@pytest.mark.parametrize("floating_ip", ["reserved", "adhoc"])
def test_killed_at_every_step_resume_or_release_leaves_nothing(fake, settings, monkeypatch, floating_ip):
    """Stop the provision at every save (the state file then lacks that step), as a killed process would."""
    settings["chameleon"]["floating_ip"] = floating_ip
    total = _saves_of_a_full_provision(settings)
    assert total >= 8
    once = 3 if floating_ip == "adhoc" else 2  # lease, server (and the ad-hoc IP): each created once
    for kill_at in range(1, total + 1):
        start = len(creates(fake))
        with pytest.raises(KeyboardInterrupt):
            provision(settings, recorder=Recorder(fail_at_save=kill_at), state=state_module.load())
        if kill_at % 2:  # odd: run again, which must finish with exactly one of each
            state, _ = provision(settings)
            assert fake.held() == ONE_EACH, f"resumed after kill at save {kill_at}"
            assert state.hosts
            assert len(creates(fake)) - start == once, f"something was created twice (kill at save {kill_at})"
        release_from_file(settings)
        assert fake.held() == ZERO, f"killed at save {kill_at}"
        state_module.clear()


def test_provision_process_killed_while_waiting_then_release(fake, settings, tmp_path):
    """A real `kill -9` of a provision waiting for the server to build."""
    fake.server_polls_to_active = 10**6  # BUILD forever
    settings_file = tmp_path / "settings.json"
    settings_file.write_text(json.dumps(settings))
    script = (
        "import json, sys\n"
        "from provision import state\n"
        "from provision.targets import chameleon\n"
        f"settings = json.load(open({str(settings_file)!r}))\n"
        "chameleon.provision(settings, {}, state.load(), state.save, print)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=os.environ.copy(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            current = state_module.load()
            if current and any(s.get("id") for s in current.chameleon.get("servers", [])):
                break
            assert child.poll() is None, child.stdout.read().decode()
            time.sleep(0.1)
        else:
            pytest.fail("the provision never got to the server")
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=10)
    assert fake.held() == {"leases": 1, "servers": 1, "floatingips": 1}
    release_from_file(settings)
    assert fake.held() == ZERO


@pytest.mark.parametrize("failure", ["server_delete", "lease_delete"])
def test_release_refused_by_the_cloud_keeps_the_state(fake, settings, failure):
    provision(settings)
    fake.fail[failure] = True
    with pytest.raises(ChameleonError) as caught:
        release_from_file(settings)
    message = str(caught.value)
    assert "still there" in message and "fab teardown" in message
    kept = state_module.load()
    if failure == "lease_delete":
        assert "lease triton-lab-alice" in message
        assert kept.chameleon["lease"]["id"] and fake.held()["leases"] == 1
    else:
        assert "server triton-lab-alice-node1" in message
        assert kept.chameleon["servers"][0]["id"]
    fake.fail.clear()
    release_from_file(settings)  # the retry finishes the job
    assert fake.held() == ZERO


def test_adhoc_floating_ip_is_deallocated(fake, settings):
    settings["chameleon"]["floating_ip"] = "adhoc"
    provision(settings)
    assert fake.held() == ONE_EACH
    assert not any(
        r["resource_type"] == "virtual:floatingip" for lease in fake.leases.values() for r in lease["reservations"]
    )
    release_from_file(settings)
    assert fake.held() == ZERO
    assert [p for m, p in fake.requests if m == "DELETE" and "/floatingips/" in p]


def test_status_and_extend(fake, settings):
    state, _ = provision(settings, {"hours": 3})
    report = target.status(state, settings)
    assert report["lease"]["status"] == "ACTIVE"
    assert 2.9 * 3600 < report["lease"]["time_left_s"] <= 3 * 3600
    assert report["servers"] == [
        {
            "name": "triton-lab-alice-node1",
            "status": "ACTIVE",
            "floating_ip": state.hosts[0].address,
            "fixed_ip": state.chameleon["servers"][0]["fixed_ip"],
        }
    ]
    end = datetime.fromisoformat(state.chameleon["lease"]["end"])
    recorder = Recorder()
    target.extend(state, settings, 2, recorder.save, recorder.say)
    assert datetime.fromisoformat(state_module.load().chameleon["lease"]["end"]) - end == timedelta(hours=2)
    assert "now ends" in recorder.text
    release_from_file(settings)


def lease_updates(fake: FakeOpenStack) -> int:
    return sum(1 for method, path in fake.requests if method == "PUT" and "/leases/" in path)


def test_an_extension_blazar_refuses_is_not_retried(fake, settings):
    # Blazar refuses with a 500 (NotEnoughHostsAvailable has no code of its own): no retry can change that.
    state, _ = provision(settings, {"hours": 3})
    end = state.chameleon["lease"]["end"]
    fake.fail["lease_extend"] = True
    recorder = Recorder()
    with pytest.raises(ChameleonError) as refused:
        target.extend(state, settings, 2, recorder.save, recorder.say)
    assert "refused to extend lease" in str(refused.value) and "Not enough hosts available" in str(refused.value)
    assert "within 48 h of its end and if no one reserved the node after it" in str(refused.value)
    assert lease_updates(fake) == 1 and "retrying" not in recorder.text
    assert state_module.load().chameleon["lease"]["end"] == end
    release_from_file(settings)


def test_an_extension_whose_answer_is_lost_extends_once(fake, settings, capsys):
    state, _ = provision(settings, {"hours": 3})
    end = datetime.fromisoformat(state.chameleon["lease"]["end"])
    fake.fault("PUT", r"/reservation/.*/leases/[^/]+", "lost")  # applied, then answered 504
    recorder = Recorder()
    target.extend(state, settings, 2, recorder.save, recorder.say)
    lease = next(iter(fake.leases.values()))
    assert lease["end_date"].replace(tzinfo=timezone.utc) - end == timedelta(hours=2), "once, not twice"
    assert lease_updates(fake) == 1, "the lease read after the 504 showed the new end: not sent again"
    assert "extending the lease answered 504, retrying" in capsys.readouterr().out
    assert datetime.fromisoformat(state_module.load().chameleon["lease"]["end"]) - end == timedelta(hours=2)
    release_from_file(settings)


def test_an_extension_retries_a_gateway_error_that_changed_nothing(fake, settings):
    state, _ = provision(settings, {"hours": 3})
    end = datetime.fromisoformat(state.chameleon["lease"]["end"])
    fake.fault("PUT", r"/reservation/.*/leases/[^/]+", 503)  # not served
    target.extend(state, settings, 1, Recorder().save, Recorder().say)
    assert lease_updates(fake) == 2
    assert next(iter(fake.leases.values()))["end_date"].replace(tzinfo=timezone.utc) - end == timedelta(hours=1)
    release_from_file(settings)


def test_no_free_floating_ip_is_told_apart_from_no_free_node(fake, settings):
    fake.fail["lease_create"] = "no_fips"  # a 500 in the same words as the hosts' shortage
    with pytest.raises(ChameleonError) as caught:
        provision(settings)
    message = str(caught.value)
    assert not isinstance(caught.value, NoHostsError)
    assert "no floating IP is free to reserve with the lease" in message and "Not enough floating IPs available" in message
    assert "--floating-ip adhoc" in message and "lab.chameleon.floating_ip: adhoc" in message
    assert fake.held() == ZERO and target.holds_nothing(state_module.load())
    state_module.clear()  # as `fab provision` does with a state that holds nothing
    provision(settings, {"floating_ip": "adhoc"})  # what the message says to do
    assert fake.held() == ONE_EACH
    release_from_file(settings)
    assert fake.held() == ZERO


def test_a_restricted_credential_is_named_when_blazar_answers_500(fake, settings):
    fake.fail["lease_create"] = "restricted_credential"
    with pytest.raises(ChameleonError) as caught:
        provision(settings)
    message = str(caught.value)
    assert "HTTP 500" in message and "made without 'Unrestricted'" in message
    assert "Identity > Application Credentials" in message and "roles member and reader" in message
    assert fake.held() == ZERO
    release_from_file(settings)


def test_a_member_only_credential_is_named_when_nova_answers_403(fake, settings):
    fake.fail["member_only"] = True  # the lease is made, then the server is refused
    with pytest.raises(ChameleonError) as caught:
        provision(settings)
    message = str(caught.value)
    assert "403 Forbidden" in message and "the member role alone" in message and "reader" in message
    release_from_file(settings)  # what was made is released
    assert fake.held() == ZERO


def test_the_deadline_is_the_lease_end_as_the_cloud_says_now(fake, settings):
    state, _ = provision(settings, {"hours": 3})
    recorded = datetime.fromisoformat(state.chameleon["lease"]["end"])
    assert target.deadline(state, settings) == recorded
    # Extended from another terminal (or the web UI): this state does not know, the cloud does.
    lease = next(iter(fake.leases.values()))
    lease["end_date"] += timedelta(hours=1)
    assert target.deadline(state, settings) == recorded + timedelta(hours=1)
    # Blazar does not answer: the end recorded at provision is the best there is.
    fake.fault("GET", r"/reservation/v1/leases/.+", 503, times=100)
    assert target.deadline(state, settings) == recorded
    fake.faults.clear()
    release_from_file(settings)


def test_existing_key_pair_with_another_key_is_not_replaced(fake, settings):
    other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBd2k7x9q5Q3nK1ZrS0vR6gM8fT2yU4wE1aH7cJ3pL9o other"
    fake.keypairs["triton-lab-alice"] = {
        "name": "triton-lab-alice",
        "public_key": other,
        "fingerprint": fake_openstack.fingerprint(other),
        "type": "ssh",
    }
    with pytest.raises(ChameleonError, match="holds another public key"):
        provision(settings)
    assert fake.held() == ZERO and fake.keypairs["triton-lab-alice"]["public_key"] == other


# -- credentials ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"OS_AUTH_URL": None}, "OS_AUTH_URL"),
        ({"OS_AUTH_URL": "chi.tacc.chameleoncloud.org"}, "OS_AUTH_URL"),
        ({"OS_APPLICATION_CREDENTIAL_SECRET": None}, "OS_APPLICATION_CREDENTIAL_SECRET"),
        ({"OS_APPLICATION_CREDENTIAL_ID": None}, "OS_APPLICATION_CREDENTIAL_ID"),
        ({"OS_REGION_NAME": None}, "OS_REGION_NAME"),
        ({"OS_REGION_NAME": "CHI@UC"}, "OS_REGION_NAME"),
        ({"OS_AUTH_TYPE": None}, "OS_AUTH_TYPE"),
        ({"OS_AUTH_TYPE": "v3token"}, "OS_TOKEN"),
        ({"OS_AUTH_TYPE": "v3token", "OS_TOKEN": "a-user-token"}, "OS_PROJECT_ID or OS_PROJECT_NAME"),
        ({"OS_AUTH_TYPE": "v3password"}, "OS_USERNAME"),
        ({"OS_AUTH_TYPE": "password"}, "set OS_AUTH_TYPE=v3password"),
        ({"OS_AUTH_TYPE": "applicationcredential"}, "set OS_AUTH_TYPE=v3applicationcredential"),
        ({"OS_AUTH_TYPE": "v3chameleonoidc"}, "needs ccauth's keystoneauth plugin"),
        (
            {"OS_CLOUD": "chameleon", "OS_AUTH_TYPE": None, "OS_AUTH_URL": None},
            "OS_CLOUD=chameleon names an entry of a clouds.yaml, which python-chi does not read",
        ),
    ],
)
def test_bad_credentials_name_the_variable(fake, settings, monkeypatch, change, named):
    for name, value in change.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    with pytest.raises(CredentialsError, match=named) as caught:
        provision(settings)
    assert "Application Credentials" in str(caught.value)
    assert fake_openstack.APP_CRED_SECRET not in str(caught.value)
    assert isinstance(caught.value, RuntimeError)  # tasks.py turns RuntimeError into "error: ..."
    assert not creates(fake)


def test_no_credentials_at_all_lists_what_to_set():
    with pytest.raises(CredentialsError) as caught:
        check_credentials({}, "CHI@TACC")
    for name in ("OS_AUTH_URL", "OS_REGION_NAME", "OS_APPLICATION_CREDENTIAL_ID", "OS_APPLICATION_CREDENTIAL_SECRET"):
        assert name in str(caught.value)
    assert "https://chi.tacc.chameleoncloud.org" in str(caught.value)


def test_wrong_secret_is_reported_as_credentials(fake, settings, monkeypatch):
    monkeypatch.setenv("OS_APPLICATION_CREDENTIAL_SECRET", "s3cr3t-but-wrong")
    with pytest.raises(CredentialsError, match="refused the credentials") as caught:
        provision(settings)
    assert "OS_APPLICATION_CREDENTIAL_ID/SECRET" in str(caught.value)
    assert "s3cr3t-but-wrong" not in str(caught.value)
    assert not creates(fake)


def test_token_credentials_work(fake, settings, monkeypatch):
    monkeypatch.delenv("OS_APPLICATION_CREDENTIAL_ID")
    monkeypatch.delenv("OS_APPLICATION_CREDENTIAL_SECRET")
    monkeypatch.setenv("OS_AUTH_TYPE", "v3token")
    monkeypatch.setenv("OS_TOKEN", "a-user-token")
    monkeypatch.setenv("OS_PROJECT_ID", fake_openstack.PROJECT_ID)
    provision(settings)
    assert fake.held() == ONE_EACH
    assert "a-user-token" not in Path(os.environ["LAB_STATE_FILE"]).read_text()
    release_from_file(settings)
    assert fake.held() == ZERO


def test_time_left_is_readable():
    end = (datetime.now(timezone.utc) + timedelta(hours=2, minutes=30, seconds=30)).isoformat()
    assert target._time_left(end)[1] == "2 h 30 min"
    assert target._time_left((datetime.now(timezone.utc) - timedelta(minutes=1)).isoformat())[1] == "ended"


# --------------------------------------------------------------------------- transient faults

SERVER = r"/compute/v2\.1/servers/[^/]+"
LEASE = r"/reservation/v1/leases/[^/]+"
LEASES = r"/reservation/v1/leases"
FLOATING_IPS = r"/network/v2\.0/floatingips"


@pytest.mark.parametrize(
    ("method", "path", "kind", "times", "told"),
    [
        ("DELETE", SERVER, 500, 1, "deleting server"),
        ("DELETE", LEASE, 409, 1, "deleting lease"),
        ("GET", FLOATING_IPS, "drop", 1, "listing floating IPs lost its connection"),
    ],
    ids=["500-on-server-delete", "409-on-lease-delete", "dropped-floating-ip-listing"],
)
def test_one_teardown_survives_a_transient_fault_and_leaves_zero(fake, settings, method, path, kind, times, told):
    provision(settings)
    fake.fault(method, path, kind, times=times)
    _, recorder = release_from_file(settings)
    assert fake.held() == ZERO
    assert told in recorder.text and "retrying in" in recorder.text, recorder.text


def test_a_provision_survives_two_503s_on_a_lease_read(fake, settings):
    fake.lease_polls_to_active = 2  # PENDING first: provision reads the lease while waiting
    fake.fault("GET", LEASE, 503, times=2)
    state, recorder = provision(settings)
    assert state.hosts and fake.held() == ONE_EACH
    assert recorder.text.count("answered 503, retrying in") == 2
    release_from_file(settings)
    assert fake.held() == ZERO


def test_a_permanent_500_ends_with_the_clear_message_after_the_configured_attempts(fake, settings):
    provision(settings)
    fake.fault("DELETE", SERVER, 500, times=100)
    with pytest.raises(ChameleonError, match="still there") as caught:
        release_from_file(settings, recorder := Recorder())
    assert "fab teardown" in str(caught.value)
    attempts = settings["chameleon"]["retry"]["attempts"]
    assert recorder.text.count("deleting server") - 1 == attempts - 1, "one line per retry, then the message"
    fake.faults.clear()
    release_from_file(settings)
    assert fake.held() == ZERO


def test_a_lease_create_whose_answer_is_lost_is_found_and_used_not_duplicated(fake, settings):
    fake.fault("POST", LEASES, "lost")
    state, recorder = provision(settings)
    assert fake.held() == ONE_EACH, "one lease: the create was not repeated"
    assert "but lease triton-lab-alice exists: continuing with it" in recorder.text
    assert "create_sent" not in state.chameleon["lease"]
    release_from_file(settings)
    assert fake.held() == ZERO


def test_a_lost_lease_create_that_cannot_be_checked_is_kept_for_teardown(fake, settings):
    fake.fault("POST", LEASES, "lost")
    # ...and, after the look-up before the create, Blazar cannot list leases for a while.
    fake.fault("GET", LEASES, 500, times=100, skip=1)
    with pytest.raises(ChameleonError):
        provision(settings)
    kept = state_module.load()
    assert kept.chameleon["lease"] == {"name": "triton-lab-alice", "create_sent": True}
    assert "asked for; Blazar's answer did not come" in target.held(kept)
    fake.faults.clear()
    release_from_file(settings)  # what `fab teardown` does: finds the lease by its name
    assert fake.held() == ZERO


def test_leases_that_are_ending_are_never_adopted(fake, settings):
    from provision.targets.chameleon.cloud import LEASE_ENDING, LEASE_STATUSES, ChameleonCloud

    assert LEASE_ENDING < set(LEASE_STATUSES) and "DELETED" not in LEASE_STATUSES
    provision(settings)
    cloud = ChameleonCloud("CHI@TACC", poll_interval_s=0.01)
    (lease,) = fake.leases.values()
    for status in sorted(LEASE_ENDING):
        lease["status"] = status
        assert cloud.find_lease("triton-lab-alice") is None, status
    lease["status"] = "ACTIVE"
    release_from_file(settings)
    assert fake.held() == ZERO


# -- a lease the user holds: `fab provision --target chameleon --lease NAME_OR_ID` ---------------------------
# Made in the dashboard, of another project, ended, booked ahead, without a node. Provision launches
# on it and teardown leaves it (unless --release-lease).

OTHER_PROJECT = "p" + "7" * 31


def lease_creates(fake) -> list:
    return [path for method, path in creates(fake) if path.endswith("/leases")]


def release_with(settings, **options):
    recorder = Recorder()
    state = state_module.load()
    target.release(state, settings, recorder.save, recorder.say, options)
    return state, recorder


def test_a_lease_booked_in_the_dashboard_is_worked_on_and_left_at_teardown(fake, settings):
    booked = fake.book_lease("my-p100-slot", floating_ips=1, hours=6)
    state, recorder = provision(settings, {"lease": "my-p100-slot"})

    assert lease_creates(fake) == [], "no second lease"
    assert fake.held() == {"leases": 1, "servers": 1, "floatingips": 1}
    lease = state.chameleon["lease"]
    assert (lease["id"], lease["ours"], lease["node_type"], lease["node_count"]) == (booked["id"], False, "gpu_p100", 1)
    [server] = fake.servers.values()
    assert server["_reservation"] == lease["node_reservation_id"]
    assert state.chameleon["servers"][0]["floating_ip_source"] == "lease", "the lease's reserved address"
    assert f"using your lease my-p100-slot ({booked['id']}): 1 x gpu_p100, ACTIVE" in recorder.text
    assert "its reserved floating IPs" in recorder.text

    status = "\n".join(target.status_lines(state, settings))
    assert "lease my-p100-slot (yours: teardown leaves it) on CHI@TACC: ACTIVE" in status
    end = target.deadline(state, settings)
    target.extend(state, settings, 2, Recorder().save, Recorder().say)
    assert target.deadline(state, settings) - end == timedelta(hours=2), "extend and the bench's guard work on it"

    _, recorder = release_with(settings)
    assert fake.held() == {"leases": 1, "servers": 0, "floatingips": 1}, "the lease and its address stay"
    assert f"left your lease my-p100-slot ({booked['id']}) as it is" in recorder.text
    assert "`fab teardown --release-lease` deletes it" in recorder.text
    assert "released what provision made on CHI@TACC (verified with the cloud); your lease stays" in recorder.text


def test_by_id_without_reserved_addresses_takes_ad_hoc_ones_and_release_lease_deletes_it(fake, settings):
    booked = fake.book_lease("course-lease")
    state, recorder = provision(settings, {"lease": booked["id"]})
    assert state.chameleon["floating_ip"] == "adhoc" and "ad-hoc floating IPs (it reserves none)" in recorder.text
    assert fake.held() == {"leases": 1, "servers": 1, "floatingips": 1}

    _, recorder = release_with(settings, release_lease=True)
    assert fake.held() == {"leases": 0, "servers": 0, "floatingips": 0}
    assert "deleting lease course-lease" in recorder.text


def test_a_lease_of_two_nodes_with_one_reserved_address_takes_an_ad_hoc_one_for_the_second(fake, settings):
    fake.hosts.append({"id": "host-x", "hypervisor_hostname": "x", "node_type": "gpu_p100", "node_name": "P-002"})
    fake.book_lease("two-nodes", count=2, floating_ips=1)
    state, _ = provision(settings, {"lease": "two-nodes"})
    assert [s["floating_ip_source"] for s in state.chameleon["servers"]] == ["lease", "adhoc"]
    assert len({host.address for host in state.hosts}) == 2
    release_with(settings)
    assert fake.held() == {"leases": 1, "servers": 0, "floatingips": 1}, "the ad-hoc address went, the reserved stays"


@pytest.mark.parametrize(
    "make, reference, expected",
    [
        (lambda fake: None, "no-such-lease", r"no lease 'no-such-lease' at CHI@TACC: your project's leases there: "
         r"someone-elses-in-project \(ACTIVE\)\. Give its name or id"),
        (lambda fake: fake.book_lease("theirs", project_id=OTHER_PROJECT)["id"], None,
         r"belongs to another project \(Blazar: Policy doesn't allow blazar:leases:get to be performed\.\)"),
        (lambda fake: "addresses-only" if fake.book_lease("addresses-only", count=0, floating_ips=1) else None,
         None, r"reserves no node \(its reservations: virtual:floatingip\)"),
    ],
    ids=["unknown", "another-project", "no-node"],
)  # fmt: skip
def test_a_lease_that_cannot_be_used_gets_one_message_and_nothing_is_made(fake, settings, make, reference, expected):
    fake.hosts.append({"id": "host-y", "hypervisor_hostname": "y", "node_type": "gpu_p100", "node_name": "P-003"})
    fake.book_lease("someone-elses-in-project")
    reference = make(fake) or reference
    with pytest.raises(LeaseNotUsable, match=expected):
        provision(settings, {"lease": reference})
    assert lease_creates(fake) == [] and fake.held()["servers"] == 0
    assert not [path for method, path in fake.requests if method == "POST" and path.endswith("/os-keypairs")], (
        "the lease is checked before the key pair is uploaded"
    )
    assert target.holds_nothing(state_module.load()), "nothing to release: the state is forgotten"


def test_an_ended_lease_is_named_with_its_end(fake, settings):
    booked = fake.book_lease("last-week")
    fake.leases[booked["id"]]["status"] = "TERMINATED"
    with pytest.raises(LeaseNotUsable, match=r"lease last-week \(.*\) at CHI@TACC is TERMINATED \(its end: .*\): book"):
        provision(settings, {"lease": "last-week"})


def test_a_lease_you_booked_ahead_is_recorded_until_its_start_then_launched_on(fake, settings):
    start = fake_openstack._now() + timedelta(hours=3)
    fake.book_lease("tomorrow-morning", start=start)
    state, recorder = provision(settings, {"lease": "tomorrow-morning"})
    assert state.hosts == [] and fake.held()["servers"] == 0
    assert "lease tomorrow-morning is booked: it starts " in recorder.text and " UTC (" in recorder.text
    lease = state_module.load().chameleon["lease"]
    assert lease["status"] == "PENDING" and not lease["ours"]
    assert datetime.fromisoformat(lease["start"]).replace(tzinfo=None) == start.replace(second=0, microsecond=0)
    assert "booked ahead: the lease starts " in "\n".join(target.status_lines(state, settings))

    fake.advance(hours=3)  # its start: PENDING -> STARTING -> ACTIVE
    state, _ = provision(settings)
    assert len(state.hosts) == 1 and fake.held()["servers"] == 1
    release_with(settings)
    assert fake.held()["leases"] == 1, "teardown leaves the booked lease"


def test_the_same_lease_again_continues_and_another_is_refused(fake, settings):
    fake.book_lease("first")
    provision(settings, {"lease": "first"})
    _, recorder = provision(settings, {"lease": "first"})
    assert "already provisioned: nothing new was created" in recorder.text
    _, recorder = provision(settings)  # without --lease: the recorded one
    assert "already provisioned: nothing new was created" in recorder.text and lease_creates(fake) == []
    with pytest.raises(ValueError, match=r"already provisioned on lease first .*`fab teardown` first"):
        provision(settings, {"lease": "second"})


# -- a node by name or property: --node NAME, --resource-property KEY=VALUE ---------------------------------


def host_reservations(fake) -> list[dict]:
    return [r for lease in fake.leases.values() for r in lease["reservations"] if r["resource_type"] == "physical:host"]


@pytest.fixture
def three_p100s(fake):
    """The fake site with three gpu_p100 hosts, the third with two GPUs (the node a course books by name)."""
    fake.hosts[:] = [
        {"id": f"host-{i}", "hypervisor_hostname": f"h{i}", "node_type": "gpu_p100", "node_name": f"P3-GPU-00{i}",
         "gpu.gpu_count": "2" if i == 3 else "1"}
        for i in (1, 2, 3)
    ]  # fmt: skip
    return fake


def test_a_node_asked_by_name_is_the_one_reserved(three_p100s, settings):
    state, recorder = provision(settings, {"node": ["P3-GPU-002"]})
    [reservation] = host_reservations(three_p100s)
    assert json.loads(reservation["resource_properties"]) == ["==", "$node_name", "P3-GPU-002"]
    assert reservation["_hosts"] == ["host-2"]
    assert "reserving node(s) P3-GPU-002 at CHI@TACC" in recorder.text
    assert state.chameleon["nodes"] == ["P3-GPU-002"] and len(state.hosts) == 1
    release_from_file(settings)
    assert three_p100s.held() == ZERO


def test_two_nodes_by_name_get_a_reservation_and_a_server_each(three_p100s, settings):
    state, _ = provision(settings, {"node": ["P3-GPU-001", "P3-GPU-003"]})
    reservations = host_reservations(three_p100s)
    assert [r["_hosts"] for r in reservations] == [["host-1"], ["host-3"]]
    assert sorted(s["_reservation"] for s in three_p100s.servers.values()) == sorted(r["id"] for r in reservations)
    assert len(state.hosts) == 2
    release_from_file(settings)
    assert three_p100s.held() == ZERO


def test_a_node_the_site_does_not_have_is_named_with_similar_ones_and_nothing_is_made(three_p100s, settings):
    with pytest.raises(ChameleonError, match=r"no node P3-GPU-009 at CHI@TACC \(similar names: P3-GPU-00"):
        provision(settings, {"node": ["P3-GPU-009"]})
    assert creates(three_p100s) == [] and three_p100s.held() == ZERO


def test_a_resource_property_narrows_the_nodes_of_the_type(three_p100s, settings):
    provision(settings, {"resource_property": ["gpu.gpu_count=2"]})
    [reservation] = host_reservations(three_p100s)
    assert json.loads(reservation["resource_properties"]) == [
        "and", ["==", "$node_type", "gpu_p100"], ["==", "$gpu.gpu_count", "2"],
    ]  # fmt: skip
    assert reservation["_hosts"] == ["host-3"], "the two-GPU node"
    release_from_file(settings)
    with pytest.raises(ValueError, match=r"--resource-property 'gpu_count': use KEY=VALUE"):
        provision(settings, {"resource_property": ["gpu_count"]})


def test_a_node_type_the_site_does_not_have_names_the_site_that_has_it(fake, settings):
    settings["chameleon"]["node_type"] = "gpu_v100"
    with pytest.raises(NoHostsError, match=r"CHI@TACC has no gpu_v100 node \(.*\); its node types: gpu_p100\. "
                       r"it is at CHI@UC: --site CHI@UC with that site's credentials"):  # fmt: skip
        provision(settings)
    assert fake.held() == ZERO


# -- a lease booked ahead: --start "YYYY-MM-DD HH:MM" | earliest ---------------------------------------------


def local_time(from_now: timedelta) -> str:
    """A --start value: this machine's local time, to the minute."""
    return (datetime.now() + from_now).strftime("%Y-%m-%d %H:%M")


def test_a_later_start_books_a_pending_lease_and_provision_returns_saying_when(fake, settings):
    asked = local_time(timedelta(hours=5))
    state, recorder = provision(settings, {"start": asked})
    [lease] = fake.leases.values()
    expected = datetime.strptime(asked, "%Y-%m-%d %H:%M").astimezone(timezone.utc).replace(tzinfo=None)
    assert lease["start_date"] == expected, "the local time, sent in UTC"
    assert lease["end_date"] - lease["start_date"] == timedelta(hours=3), "the lease's hours from its start"
    assert lease["status"] == "PENDING" and state.hosts == [] and fake.held()["servers"] == 0
    assert f"lease triton-lab-alice is booked: it starts {expected:%Y-%m-%d %H:%M} UTC (" in recorder.text
    assert "in 4 h 5" in recorder.text or "in 5 h 00 min" in recorder.text
    assert target.booked_ahead(state)["ours"]

    fake.advance(hours=5)
    state, recorder = provision(settings)  # after its start: the server goes on it
    assert len(state.hosts) == 1 and "lease triton-lab-alice: ACTIVE" in recorder.text
    release_from_file(settings)
    assert fake.held() == ZERO


def test_start_earliest_takes_the_next_free_slot_from_blazar_s_calendar(fake, settings):
    busy_until = fake.block_hosts("gpu_p100", hours=5)
    _, recorder = provision(settings, {"start": "earliest"})
    [lease] = fake.leases.values()
    slot = busy_until.replace(second=0, microsecond=0) + timedelta(minutes=1)  # the minute after the other lease
    assert lease["start_date"] == slot and lease["status"] == "PENDING"
    assert f"the earliest slot for 1 x gpu_p100: {slot:%Y-%m-%d %H:%M} UTC" in recorder.text


def test_a_start_in_the_past_or_malformed_is_refused_before_anything_is_made(fake, settings):
    with pytest.raises(ValueError, match=r"is not in the future: leave it out to start now"):
        provision(settings, {"start": local_time(-timedelta(hours=1))})
    with pytest.raises(ValueError, match=r'--start \'tomorrow\': use "YYYY-MM-DD HH:MM" \(your time zone\) or earliest'):
        provision(settings, {"start": "tomorrow"})
    assert creates(fake) == []


def test_a_start_that_is_no_time_is_refused_before_the_cloud_is_asked(fake, settings):
    with pytest.raises(UsageError, match=r"--start 'tomorrow': use \"YYYY-MM-DD HH:MM\" \(your time zone\) or earliest"):
        provision(settings, {"start": "tomorrow"})
    assert fake.requests == [], "not even the credentials were sent"

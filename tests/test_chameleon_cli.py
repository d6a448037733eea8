"""`fab` on the chameleon target, end to end against the fake OpenStack (real python-chi inside fab)."""

from __future__ import annotations

import os

import pytest
from fake_openstack import FakeOpenStack
from test_chameleon import NODE_ADDRESSES, PUBLIC_KEY, SSHBanner


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

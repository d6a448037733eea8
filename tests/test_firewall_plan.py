"""What `fab deploy` opens in each host's firewalld and what it closes (provision.firewall), from the state alone.

The role that applies these openings runs against a real firewalld in tests/test_cluster.py.
"""

from __future__ import annotations

from support.states import PORTS, hosts_state

from provision import cluster, firewall

SERVICE_PORTS = [PORTS[name] for name in ("triton_http", "triton_grpc", "triton_metrics", "api", "jupyter")]
BALANCER_PORTS = [PORTS[name] for name in ("balancer_http", "balancer_grpc", "balancer_stats")]


def labels(openings: list[dict]) -> list[str]:
    return [opening["label"] for opening in openings]


def test_a_deployment_on_the_loopback_opens_nothing():
    state = hosts_state(2)
    assert firewall.openings(state, {}, PORTS, "127.0.0.1") == {"node-1": [], "node-2": []}


def test_a_cluster_opens_each_backend_s_triton_to_the_balancer_s_address_only():
    state = hosts_state(3)
    plan = cluster.plan(state, "node-3")  # the balancer on a node of its own, at 10.52.0.3
    needed = firewall.openings(state, plan, PORTS, "127.0.0.1")
    http, grpc = PORTS["triton_http"], PORTS["triton_grpc"]
    for backend in ("node-1", "node-2"):
        assert labels(needed[backend]) == [f"{http}/tcp from 10.52.0.3", f"{grpc}/tcp from 10.52.0.3"]
    assert needed["node-3"] == [], "the balancer listens on the loopback: nothing to open there"
    assert needed["node-1"][0] == {
        "kind": "rich-rule",
        "value": f'rule family="ipv4" source address="10.52.0.3" port port="{http}" protocol="tcp" accept',
        "label": f"{http}/tcp from 10.52.0.3",
    }


def test_a_balancer_that_also_serves_needs_no_rule_for_its_own_traffic():
    state = hosts_state(2)
    needed = firewall.openings(state, cluster.plan(state), PORTS, "127.0.0.1")
    assert needed["node-1"] == [] and len(needed["node-2"]) == 2


def test_publish_opens_every_service_port_to_everyone_or_in_a_cluster_the_balancer_s():
    state = hosts_state(2)
    published = firewall.openings(state, {}, PORTS, "0.0.0.0")
    for host in ("node-1", "node-2"):
        assert labels(published[host]) == [f"{port}/tcp from anywhere" for port in SERVICE_PORTS]
        assert {o["kind"] for o in published[host]} == {"port"}
    in_cluster = firewall.openings(state, cluster.plan(state), PORTS, "0.0.0.0")
    assert labels(in_cluster["node-1"]) == [f"{port}/tcp from anywhere" for port in BALANCER_PORTS]
    assert len(in_cluster["node-2"]) == 2, "the backend's Triton, from the balancer only"


def test_an_ipv6_source_gets_an_ipv6_rule():
    opening = firewall.source_opening(8000, "fd00::3")
    assert 'rule family="ipv6" source address="fd00::3"' in opening["value"]


def test_a_later_deploy_closes_what_it_no_longer_needs_and_the_state_keeps_what_may_be_open():
    state = hosts_state(2)
    before = firewall.openings(state, {}, PORTS, "0.0.0.0")  # deployed with --publish
    state.deploy = {"firewall": before}
    needed = firewall.openings(state, {}, PORTS, "127.0.0.1")  # deployed again without it
    assert firewall.no_longer_needed(firewall.recorded(state), needed) == before
    assert firewall.union(before, needed) == before
    again = firewall.openings(state, {}, PORTS, "0.0.0.0")
    assert firewall.no_longer_needed(firewall.recorded(state), again) == {"node-1": [], "node-2": []}


def test_which_bind_addresses_are_published():
    assert not firewall.is_published("127.0.0.1") and not firewall.is_published("localhost")
    assert firewall.is_published("0.0.0.0") and firewall.is_published("::") and firewall.is_published("10.52.0.3")

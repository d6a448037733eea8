"""Where a cluster's balancer runs and which hosts it balances (provision.cluster), from the state alone."""

from __future__ import annotations

import pytest
from support.states import PORTS, hosts_state

from provision import cluster
from provision.state import Host, State


def names(hosts: list[Host]) -> list[str]:
    return [host.name for host in hosts]


def test_without_lb_node_the_first_host_serves_and_balances_every_host():
    state = hosts_state(3)
    plan = cluster.plan(state)
    assert plan["balancer"] == "node-1" and not plan["own_node"]
    assert plan["addresses"] == {"node-1": "10.52.0.1", "node-2": "10.52.0.2", "node-3": "10.52.0.3"}, "fixed IPs"
    assert names(cluster.backends(state, plan)) == ["node-1", "node-2", "node-3"]


def test_lb_node_gives_the_balancer_a_node_of_its_own_which_is_no_backend():
    state = hosts_state(3)
    plan = cluster.plan(state, "node-3")
    assert plan["balancer"] == "node-3" and plan["own_node"]
    assert names(cluster.backends(state, plan)) == ["node-1", "node-2"]
    backends = cluster.balancer_backends(state, plan, PORTS)
    assert [(b["name"], b["address"], b["http_port"]) for b in backends] == [
        ("node-1", "10.52.0.1", PORTS["triton_http"]),
        ("node-2", "10.52.0.2", PORTS["triton_http"]),
    ]
    assert cluster.plan(state, "1")["balancer"] == "node-2", "a host's index (from 0) works as its name does"


def test_a_later_deploy_keeps_the_deployed_balancer():
    recorded = {"balancer": "node-2", "own_node": True, "addresses": {}}
    assert cluster.plan(hosts_state(2, recorded=recorded)) | {"addresses": {}} == recorded
    shared = {"balancer": "node-2", "own_node": False, "addresses": {}}
    assert not cluster.plan(hosts_state(2, recorded=shared))["own_node"]


def test_a_node_of_its_own_needs_another_host_to_serve_and_an_unknown_node_is_named():
    with pytest.raises(cluster.ClusterError, match=r"--lb-node node-1: .* leaves no host to serve.*--count 2"):
        cluster.plan(hosts_state(1), "node-1")
    with pytest.raises(cluster.ClusterError, match="--lb-node: .*node-9"):
        cluster.plan(hosts_state(2), "node-9")
    with pytest.raises(cluster.ClusterError, match="a cluster needs hosts of their own"):
        cluster.plan(State(target="local", hosts=[Host(name="local", address="127.0.0.1", connection="local")]))


def test_no_cluster_has_no_backends():
    state = hosts_state(2)
    assert cluster.backends(state, {}) == [] and cluster.balancer_backends(state, {}, PORTS) == []

"""The suite's budget of expensive operations (tests/support/budget.py): what counts, and what is over."""

from __future__ import annotations

from collections import Counter

from support.budget import budget, kind, report


def test_the_expensive_fab_commands_are_counted_by_kind_and_the_cheap_ones_are_not():
    assert kind(("deploy",), "process") == "deploy"
    assert kind(("deploy", "--cluster"), "docker") == "deploy (docker runtime)", "a docker deploy builds images"
    assert kind(("deploy", "--check"), "process") is None, "check mode changes nothing"
    assert kind(("-f", "/tmp/unstable.yaml", "tune", "--model", "m"), "process") == "tune", "after fab -f FILE"
    assert kind(("bench", "--quick"), "process") == "bench" and kind(("run", "--target", "local"), None) == "run"
    assert [kind((task,), "process") for task in ("provision", "status", "teardown", "compare")] == [None] * 4


def test_a_count_over_its_budget_is_named_and_a_kind_with_no_budget_is_over():
    lines, over = report(Counter({"deploy": 3, "bench": 1, "image build": 1}), {"deploy": 2, "bench": 5})
    assert "  deploy: 3 (budget 2)" in lines and "  bench: 1 (budget 5)" in lines
    assert over == ["deploy: 3 over the budget of 2", "image build: 1 over the budget of 0"]


def test_the_committed_budget_names_every_kind_counted():
    assert set(budget()) == {"deploy", "deploy (docker runtime)", "bench", "tune", "run"}

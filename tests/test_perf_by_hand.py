"""`fab perf`: perf_analyzer's line as the course types it, made to reach the deployed Triton.
(The line runs for real on a deployed host in tests/test_pipeline.py, both targets.)"""

from __future__ import annotations

import pytest

from provision.errors import UsageError
from provision.perf_by_hand import arguments


def test_fab_perf_takes_the_course_s_line_as_typed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "input.json").write_text("{}")
    args, files = arguments(
        "perf_analyzer -u triton_server:8000  -m food_classifier  --input-data input.json -b 1", "127.0.0.1:9000"
    )
    assert args == ["-u", "127.0.0.1:9000", "-m", "food_classifier", "--input-data", "input.json", "-b", "1"]
    assert files == [tmp_path / "input.json"] or [f.resolve() for f in files] == [tmp_path / "input.json"]
    assert arguments("-m ensemble --url=x:1 -uy:2", "h:1")[0] == ["-u", "h:1", "-m", "ensemble"]


def test_a_line_without_arguments_says_what_to_give():
    with pytest.raises(UsageError, match="give perf_analyzer's arguments"):
        arguments("perf_analyzer", "h:1")


def test_the_report_s_command_pastes_as_a_fab_perf_line(tmp_path):
    from provision.report import by_hand

    line = by_hand(
        "perf_analyzer -m m -u 1.2.3.4:8000 -i http --input-data input.json -f m.csv --percentile=95", tmp_path
    )
    assert line == f"fab perf 'perf_analyzer -m m -i http --input-data {tmp_path}/input.json --percentile=95'"

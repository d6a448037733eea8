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


def test_the_course_s_line_before_its_input_json_exists_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as refused:
        arguments("perf_analyzer -u triton_server:8000 -m food_classifier --input-data input.json -b 1", "h:1")
    assert str(refused.value).startswith("--input-data input.json: no such file here. Make one from a photo with ")
    assert "client_scripts/make_perf_input.py photo.jpg -o input.json" in str(refused.value)
    assert arguments("-m food_classifier --input-data random", "h:1")[0][-2:] == ["--input-data", "random"]


def test_perf_analyzer_s_error_is_quoted_without_its_usage_text():
    from provision.perf import without_usage

    said = (
        "Error: Failed to parse --measurement-request-count. Invalid value provided: abc\n"
        "Usage: /usr/local/bin/perf_analyzer [options]\n==== SYNOPSIS ====\n \n\t--version \n\t-m <model name>\n"
    )
    assert without_usage(said) == (
        "Error: Failed to parse --measurement-request-count. Invalid value provided: abc\n"
        "(perf_analyzer's usage text left out)"
    )
    assert without_usage("Request Rate: 1\n") == "Request Rate: 1\n", "nothing else is cut"


def test_the_report_s_command_pastes_as_a_fab_perf_line(tmp_path):
    from provision.report import by_hand

    line = by_hand(
        "perf_analyzer -m m -u 1.2.3.4:8000 -i http --input-data input.json -f m.csv --percentile=95", tmp_path
    )
    assert line == f"fab perf 'perf_analyzer -m m -i http --input-data {tmp_path}/input.json --percentile=95'"

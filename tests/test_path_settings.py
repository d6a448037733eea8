"""The settings that name a path on this machine: a mistake is one line naming the setting and the path."""

from __future__ import annotations

import pytest

from provision import path_settings
from provision.errors import UsageError


def settings(**values) -> dict:
    return {"food11_weights": "", "blip_source": "", "results_dir": "results", "runtime_dir": ".runtime", **values}


def refusal(check, *args) -> str:
    with pytest.raises(UsageError) as refused:
        check(*args)
    return str(refused.value)


def test_a_weights_path_that_is_a_folder_is_named(tmp_path):
    message = refusal(path_settings.check_weights, settings(food11_weights=str(tmp_path)))
    assert message == f"lab.food11_weights (FABRIC_LAB_FOOD11_WEIGHTS) is {tmp_path}: a folder, not a file"


def test_a_blip_folder_that_is_not_there_is_named_and_a_hub_id_passes(tmp_path):
    food11 = tmp_path / "food11.pth"
    food11.write_bytes(b"weights")
    missing = tmp_path / "blip"
    message = refusal(path_settings.check_weights, settings(food11_weights=str(food11), blip_source=str(missing)))
    assert message == f"lab.blip_source (FABRIC_LAB_BLIP_SOURCE) is {missing}: no such folder"
    path_settings.check_weights(settings(food11_weights=str(food11), blip_source="Salesforce/blip-image-captioning-base"))


def test_a_results_folder_under_a_file_is_named(tmp_path):
    (tmp_path / "a-file").write_text("")
    message = refusal(path_settings.check_results, settings(results_dir=str(tmp_path / "a-file" / "results")))
    assert message.startswith("lab.results_dir (FABRIC_LAB_RESULTS_DIR) is ")
    assert message.endswith("a-file is a file, not a folder")
    path_settings.check_results(settings(results_dir=str(tmp_path / "new" / "results")))  # made when needed

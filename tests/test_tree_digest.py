"""What a re-deploy copies (provision/tree_digest.py): only the folders, and the models, whose content changed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from provision.config import PROJECT_ROOT
from provision.tree_digest import compare


@pytest.fixture
def staged(tmp_path) -> dict[str, Path]:
    lib = tmp_path / "lib"
    (lib / "provision").mkdir(parents=True)
    (lib / "provision" / "runtime.py").write_text("print('serving')\n")
    models = tmp_path / "models"
    for name in ("food_classifier", "batching_food_classifier", "ensemble"):
        (models / name / "1").mkdir(parents=True)
        (models / name / "config.pbtxt").write_text(f'name: "{name}"\n')
    return {"lib": lib, "models/*": models}


def recorded(staged: dict[str, Path]) -> dict:
    """What the host writes to run/synced.json after a successful deploy."""
    return compare(staged, {})["digests"]


def test_a_first_deploy_copies_everything(staged):
    first = compare(staged, {})
    assert first["differ"] == ["lib", "models"]
    assert sorted(first["members"]["models"]["differ"]) == ["batching_food_classifier", "ensemble", "food_classifier"]
    assert first["members"]["models"]["removed"] == []


def test_nothing_changed_nothing_differs(staged):
    again = compare(staged, recorded(staged))
    assert again["differ"] == [] and again["members"]["models"] == {"differ": [], "removed": []}


def test_one_changed_config_is_one_model_to_load(staged):
    synced = recorded(staged)
    (staged["models/*"] / "batching_food_classifier" / "config.pbtxt").write_text("max_batch_size: 16\n")
    found = compare(staged, synced)
    assert found["differ"] == ["models"]
    assert found["members"]["models"] == {"differ": ["batching_food_classifier"], "removed": []}


def test_a_file_made_executable_is_a_change(staged):
    synced = recorded(staged)
    (staged["lib"] / "provision" / "runtime.py").chmod(0o755)
    assert compare(staged, synced)["differ"] == ["lib"]


def test_a_model_that_left_the_repository_is_named_for_unloading(staged):
    synced = recorded(staged)
    shutil.rmtree(staged["models/*"] / "ensemble")
    found = compare(staged, synced)
    assert found["members"]["models"] == {"differ": [], "removed": ["ensemble"]}


def test_a_record_from_before_per_model_digests_reloads_every_model(staged):
    synced = recorded(staged) | {"models": "0" * 64}  # one digest for the whole repository
    found = compare(staged, synced)
    assert len(found["members"]["models"]["differ"]) == 3 and found["differ"] == ["models"]


def test_the_command_line_reads_the_hosts_record(staged):
    synced = recorded(staged)
    done = subprocess.run(
        [sys.executable, "-m", "provision.tree_digest", "--synced-json", json.dumps(synced),
         *(f"{name}={path}" for name, path in staged.items())],
        cwd=PROJECT_ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(done.stdout) == {
        "digests": synced,
        "differ": [],
        "members": {"models": {"differ": [], "removed": []}},
    }


def pack_command(staged: dict[str, Path], synced: dict, archive: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "provision.tree_digest", "--synced-json", json.dumps(synced), "--pack", str(archive),
         *(f"{name}={path}" for name, path in staged.items())],
        cwd=PROJECT_ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def test_what_differs_is_packed_into_one_archive_and_nothing_else(staged, tmp_path):
    synced = recorded(staged)
    (staged["models/*"] / "batching_food_classifier" / "config.pbtxt").write_text("max_batch_size: 16\n")
    (staged["lib"] / "provision" / "runtime.py").chmod(0o755)
    archive = tmp_path / "out" / "changes.tar"
    found = pack_command(staged, synced, archive)
    assert found["archive"] == str(archive)
    with tarfile.open(archive) as tar:
        members = {info.name: info for info in tar.getmembers()}
    assert sorted(name for name, info in members.items() if info.isfile()) == [
        "lib/provision/runtime.py",
        "models/batching_food_classifier/config.pbtxt",
    ], "the unchanged models stay out"
    assert {info.mode for info in members.values() if info.isfile()} == {0o644}, "files as the roles' copies made them"
    assert {info.mode for info in members.values() if info.isdir()} == {0o755}


def test_nothing_differs_no_archive(staged, tmp_path):
    archive = tmp_path / "changes.tar"
    archive.write_text("from the deploy before")
    assert pack_command(staged, recorded(staged), archive)["archive"] is None
    assert not archive.exists(), "no archive from an earlier deploy is sent again"

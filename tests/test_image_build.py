"""provision/image_build.py's pieces that need no engine: the host's pip settings handed to the
wheelhouse container, and the failing step read from a BuildKit log (the real builds are in
tests/test_docker_deploy.py)."""

from __future__ import annotations

from provision.host import image_build

IMAGE = {"name": "triton", "tag": "lab/triton:abc", "base": "base:1", "wheelhouse": "wheels/triton",
         "pip_download": ["-r", "model_repository/requirements.txt"]}  # fmt: skip


def test_the_host_pip_settings_go_in_by_name_and_the_files_they_name_are_mounted(tmp_path):
    index = tmp_path / "pypi" / "simple"
    index.mkdir(parents=True)
    cert = tmp_path / "ca.crt"
    cert.write_text("not a real bundle\n")
    settings = {
        "cert": str(cert),
        "extra-index-url": f"file://{index} https://user:token@mirror.example/simple",
        "find-links": str(tmp_path / "missing"),  # a path that is not there is not mounted
        "default-timeout": "180",
    }
    argv, env = image_build.wheelhouse_command(IMAGE, tmp_path, settings)
    # A file index is mounted from above simple/ (its links are relative to the root); URLs are not mounted.
    assert image_build.mounts_for(settings) == [str(cert), str(tmp_path / "pypi")]
    assert f"{tmp_path / 'pypi'}:{tmp_path / 'pypi'}:ro" in argv
    assert env["PIP_EXTRA_INDEX_URL"] == settings["extra-index-url"] and "--env" in argv
    assert not [arg for arg in argv if "token" in arg], "a credential in an index URL stays off the command line"
    assert argv[-len(IMAGE["pip_download"]) :] == IMAGE["pip_download"] and "base:1" in argv


def test_pip_config_list_is_read_with_environment_variables_winning(tmp_path):
    fake_python = tmp_path / "python"
    fake_python.write_text(
        "#!/bin/sh\necho \"global.cert='/etc/ca.crt'\"\necho \"global.timeout='10'\"\n"
        "echo \"download.timeout='20'\"\necho \"install.no-deps='1'\"\n"
    )
    fake_python.chmod(0o755)
    found = image_build.host_pip_settings(str(fake_python), environ={"PIP_TIMEOUT": "30", "PIP_CONFIG_FILE": "/x"})
    assert found == {"cert": "/etc/ca.crt", "timeout": "30"}


BUILDKIT_LOG = """\
#7 [2/5] COPY model_repository/requirements.txt /opt/serving/requirements.txt
#7 DONE 0.1s
#8 [4/5] RUN --mount=type=bind,source=wheels/triton,target=/wheels pip install --no-index
#8 0.912 Looking in links: /wheels
#8 1.204 ERROR: Could not find a version that satisfies the requirement torch==2.7.1
#8 ERROR: process "/bin/sh -c pip install" did not complete successfully: exit code: 1
------
ERROR: failed to solve: process "/bin/sh -c pip install" did not complete successfully: exit code: 1
"""


def test_a_failed_build_is_told_by_its_step_and_that_step_s_last_lines():
    told = image_build.failed_step(BUILDKIT_LOG)
    assert told.startswith("the step '[4/5] RUN --mount=type=bind")
    assert "satisfies the requirement torch==2.7.1" in told and "COPY model_repository" not in told
    # Output without step numbers (another builder): its last lines.
    assert image_build.failed_step("a\nb\nc", last_lines=2) == "b\nc"

"""Build one image of the docker runtime on the host: its wheelhouse, then `docker build`.

Runs on the host with its system Python (standard library only), in the
images' build context (the triton_docker role copies it there and passes one
image of provision.runtimes.containers.images()):

    python3 lib/provision/host/image_build.py --image-json '{"tag": ..., "base": ..., ...}' --log-dir run

1. The wheelhouse. pip inside an image build sees neither the host's pip
   configuration (its index, find-links, CA bundle) nor the files it names.
   So pip in a container of the image's own base (its Python, its platform)
   downloads the wheels first, with the host's pip settings handed in as
   environment variables and the files they name mounted read-only at the same
   paths. That container is gone afterwards; nothing of it is in an image.
2. The build. The Dockerfile installs from the wheelhouse alone (`pip install
   --no-index`), which BuildKit mounts for that one RUN step, so the wheels are
   not in a layer either.
3. The wheelhouse is removed. A failed step is named, with its last lines and
   the path of the full log.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

WHEELHOUSE_IN_CONTAINER = "/wheels"
CONTEXT_IN_CONTAINER = "/context"
# pip's settings that name files or folders (the rest are plain values).
PIP_PATH_SETTINGS = ("cert", "client-cert", "find-links", "index-url", "extra-index-url", "constraint", "requirement")


class BuildError(RuntimeError):
    pass


def host_pip_settings(python: str = sys.executable, environ: dict | None = None) -> dict[str, str]:
    """{setting: value} of the host's pip: its configuration files, then its PIP_* variables.

    Sections `global` and `download` apply to `pip download`; `:env:` lines are
    PIP_* variables, which win. No pip on the host: no settings (plain PyPI).
    """
    environ = os.environ if environ is None else environ
    settings: dict[str, str] = {}
    try:
        listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60)
        lines = listed.stdout.splitlines() if listed.returncode == 0 else []
    except OSError:
        lines = []
    ranked = []
    for line in lines:
        match = re.fullmatch(r"(global|download|:env:)\.([\w-]+)='(.*)'", line.strip())
        if match:
            ranked.append(({"global": 0, "download": 1, ":env:": 2}[match[1]], match[2], match[3]))
    for _, key, value in sorted(ranked, key=lambda item: item[0]):
        settings[key] = value
    for name, value in environ.items():
        if name.startswith("PIP_") and name != "PIP_CONFIG_FILE":
            settings[name[4:].lower().replace("_", "-")] = value
    return settings


def mounts_for(settings: dict[str, str]) -> list[str]:
    """The host paths the settings name, each to be mounted read-only at the same path.

    A local index (file:///srv/pypi/simple) links its files relative to the
    index root, so the folder above `simple` is mounted.
    """
    paths: list[str] = []
    for key in PIP_PATH_SETTINGS:
        for token in settings.get(key, "").split():
            path = urlparse(token).path if token.startswith("file://") else token
            if not path.startswith("/"):
                continue  # a URL: reached over the network
            if token.startswith("file://") and Path(path).name == "simple":
                path = str(Path(path).parent)
            if Path(path).exists() and path not in paths:
                paths.append(path)
    return paths


def wheelhouse_command(image: dict, context: Path, settings: dict[str, str]) -> tuple[list[str], dict]:
    """(argv, environment) of the `docker run` whose pip downloads the image's wheels."""
    argv = [
        "docker", "run", "--rm", "--network", "host",
        "--volume", f"{context.resolve()}:{CONTEXT_IN_CONTAINER}:ro",
        "--volume", f"{(context / image['wheelhouse']).resolve()}:{WHEELHOUSE_IN_CONTAINER}",
        "--workdir", CONTEXT_IN_CONTAINER,
    ]  # fmt: skip
    env = dict(os.environ)
    for key, value in settings.items():
        name = "PIP_" + key.upper().replace("-", "_")
        env[name] = value
        argv += ["--env", name]  # the value travels in the environment, not on a command line
    for path in mounts_for(settings):
        argv += ["--volume", f"{path}:{path}:ro"]
    argv += [
        "--entrypoint", "python3", image["base"],
        "-m", "pip", "download", "--no-cache-dir", "--progress-bar", "off",
        "--dest", WHEELHOUSE_IN_CONTAINER, *image["pip_download"],
    ]  # fmt: skip
    return argv, env


def failed_step(log: str, last_lines: int = 25) -> str:
    """The failing step of a BuildKit log (--progress=plain) and its last lines."""
    failed = re.findall(r"^#(\d+) ERROR:", log, flags=re.MULTILINE)
    if not failed:
        return "\n".join(log.strip().splitlines()[-last_lines:])
    number = failed[0]
    step_lines = [line[len(f"#{number} ") :] for line in log.splitlines() if line.startswith(f"#{number} ")]
    title = step_lines[0] if step_lines else f"step #{number}"
    return f"the step {title!r} failed; its last lines:\n" + "\n".join(step_lines[-last_lines:])


def _run_logged(argv: list[str], log_file: Path, env: dict, cwd: Path) -> tuple[int, str]:
    """Run argv with its output going to the log as it comes (`tail -f` shows a build's progress)."""
    with log_file.open("a") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        start = log.tell()
        rc = subprocess.run(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    with log_file.open() as log:
        log.seek(start)
        return rc, log.read()


def build(image: dict, context: Path, log_dir: Path) -> None:
    """Wheelhouse, build, cleanup; BuildError with the failing step and the log path."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / f"build-{image['name']}.log"
    log_file.write_text("")
    wheelhouse = context / image["wheelhouse"]
    shutil.rmtree(wheelhouse, ignore_errors=True)
    wheelhouse.mkdir(parents=True)
    try:
        argv, env = wheelhouse_command(image, context, host_pip_settings())
        rc, output = _run_logged(argv, log_file, env, context)
        if rc != 0:
            tail = "\n".join(output.strip().splitlines()[-25:])
            raise BuildError(
                f"the wheels of {image['tag']} could not be downloaded (pip in {image['base']}, exit {rc}); "
                f"its last lines:\n{tail}\nfull log: {log_file}"
            )
        # BuildKit: the Dockerfiles mount the wheelhouse for one RUN step (docker 20.10 and later).
        env = dict(os.environ, DOCKER_BUILDKIT="1")
        rc, output = _run_logged([*image["build_command"], "--progress=plain"], log_file, env, context)
        if rc != 0:
            raise BuildError(f"building {image['tag']} failed (exit {rc}): {failed_step(output)}\nfull log: {log_file}")
    finally:
        shutil.rmtree(wheelhouse, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image-json", required=True, help="one image of provision.runtimes.containers.images()")
    parser.add_argument("--context", type=Path, default=Path("."), help="the build context (default: here)")
    parser.add_argument("--log-dir", type=Path, required=True, help="where build-NAME.log is written")
    args = parser.parse_args(argv)
    image = json.loads(args.image_json)
    try:
        build(image, args.context, args.log_dir)
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"built {image['tag']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

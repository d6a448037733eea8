"""`fab perf "perf_analyzer ..."`: perf_analyzer as a user types it, run where the bench runs it.

The course runs `perf_analyzer -u triton_server:8000 -m food_classifier --input-data
input.json -b 1` inside its Jupyter container. Here the same line, typed as it is,
runs on a deployed host where `fab bench` runs perf_analyzer (provision.runtimes.bench_place:
beside Triton with the libraries it needs, or in the docker runtime's API
container), with:

- `-u`/`--url` pointing at the deployed Triton (whatever the line said: the
  course's `triton_server:8000` is no name here), or added when it is missing;
- an `--input-data` file that exists here copied to the host first;
- its output printed, its exit status returned, and the host's folder removed.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from pathlib import Path

from provision import cluster as clusters
from provision import hosts as host_commands
from provision import runtimes
from provision.errors import UsageError
from provision.perf import without_usage
from provision.state import State

URL_FLAGS = ("-u", "--url")


def arguments(line: str, triton: str) -> tuple[list[str], list[Path]]:
    """(perf_analyzer's arguments with the deployed Triton as -u, the local --input-data files to copy)."""
    words = shlex.split(line)
    if words and Path(words[0]).name == "perf_analyzer":
        words = words[1:]
    if not words:
        raise UsageError('give perf_analyzer\'s arguments, e.g. fab perf "-m food_classifier --input-data input.json -b 1"')
    result, files, index = [], [], 0
    while index < len(words):
        word = words[index]
        if word in URL_FLAGS:
            index += 2  # the deployed Triton instead
            continue
        if word.startswith("--url=") or (word.startswith("-u") and not word.startswith("--")):  # -uHOST:PORT
            index += 1
            continue
        if word == "--input-data" and index + 1 < len(words):
            local = Path(words[index + 1])
            if local.is_file():
                files.append(local)
                result += [word, local.name]
                index += 2
                continue
            if local.suffix == ".json":  # the course's input.json, not made yet
                raise UsageError(
                    f"--input-data {local}: no such file here. Make one from a photo with "
                    f"`python client_scripts/make_perf_input.py photo.jpg -o {local}` (the course's input.json, "
                    "the image as base64 text: add --encoding base64), or give --input-data random"
                )
        result.append(word)
        index += 1
    return ["-u", triton, *result], files


def run(state: State, line: str, node: str = "0", say: Callable[[str], None] = print) -> int:
    """Run the perf_analyzer line on the host `node`; print its output; return its exit status."""
    if state.deploy.get("status") != "deployed":
        raise UsageError("nothing is deployed: run `fab deploy` first")
    host = host_commands.select(state.hosts, node)
    deployed = state.deploy["hosts"][host.name]
    bind = clusters.deployed_bind_addresses(state)[host.name]
    triton, _ = runtimes.triton_endpoints(state.runtime, bind, state.deploy["ports"])
    args, files = arguments(line, triton)
    run_id = time.strftime("perf-%Y%m%d-%H%M%S")
    place = runtimes.bench_place(state.runtime, deployed, run_id)
    folder = f"{deployed['home']}/bench/{run_id}"  # the bench's folder on the host (the API container mounts it)
    made = host_commands.run(host, f"mkdir -p {shlex.quote(folder)}")
    if made.returncode != 0:
        raise UsageError(f"cannot make {folder} on {host.name}: {made.stderr.strip()}")
    try:
        for local in files:
            host_commands.put(host, local, f"{folder}/{local.name}")
        command = [*place["exec"], f"{place['tools']}perf_analyzer", *args]
        sudo = "sudo " if place["become"] and host.user != "root" else ""
        say(f"on {host.name}: {shlex.join(command)}")
        libraries = shlex.quote(f"{deployed['home']}/triton/lib")  # the process runtime's perf_analyzer libraries
        done = host_commands.run(
            host, f"cd {shlex.quote(folder)} && LD_LIBRARY_PATH={libraries} {sudo}{shlex.join(command)}", timeout_s=3600
        )
        say(without_usage(done.stdout + done.stderr).rstrip())
        return done.returncode
    finally:
        host_commands.run(host, f"rm -rf {shlex.quote(folder)}")

"""`make demo`: the whole job on the local target, as a user runs it, without touching the user's own.

fab provision --target local -> fab deploy -> a classification through Triton
-> fab bench --quick -> fab teardown (always, even after a failure), then
says where the report is.

The demo ends with a teardown, so it runs as a user of its own: its own state
file and deploy folder under the runtime folder (.runtime/demo/), and ports
nothing listens on. Whatever the user has provisioned (a local deployment they
tuned, a Chameleon lease they booked for the course) is never seen by the
demo's commands, so the demo's teardown cannot release it. Its report lands in
the usual results folder, beside the user's runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from provision import config, sample_images
from provision import state as state_module
from provision.host.background import free_ports

FAB = str(Path(sys.executable).parent / "fab")


def demo_environment(settings: dict, folder: Path) -> dict[str, str]:
    """The environment of the demo's own user: a state file and deploy folder in `folder`, free ports."""
    env = dict(os.environ, LAB_STATE_FILE=str(folder / "state.json"), FABRIC_LAB_LOCAL_DEPLOY_DIR=str(folder / "deploy"))
    names = sorted(settings["ports"])
    env.update({f"FABRIC_LAB_PORTS_{name.upper()}": str(port) for name, port in zip(names, free_ports(len(names)))})
    return env


def fab(env: dict[str, str], *args: str) -> str:
    """Run `fab ARGS` as the demo's user, its output shown as it comes (a deploy takes minutes) and returned."""
    print(f"\n$ fab {' '.join(args)}", flush=True)
    with subprocess.Popen(
        [FAB, *args], cwd=config.PROJECT_ROOT, env=env, stdout=subprocess.PIPE, text=True
    ) as running:
        lines = []
        for line in running.stdout:
            print(line, end="", flush=True)
            lines.append(line)
    if running.returncode != 0:
        raise SystemExit(f"demo stopped: `fab {' '.join(args)}` failed")
    return "".join(lines)


def main() -> int:
    settings = config.settings()
    folder = config.runtime_dir(settings) / "demo"
    env = demo_environment(settings, folder)
    print(
        f"The demo runs as a user of its own (state and deploy folder in {folder}, free ports): "
        f"whatever you have provisioned ({state_module.state_file()}) is left as it is.",
        flush=True,
    )
    report = None
    try:
        fab(env, "provision", "--target", "local")
        fab(env, "deploy")
        fab(env, "status")
        photo = folder / "demo.jpg"
        photo.write_bytes(sample_images.jpeg())
        # Where this deployment's Triton listens, as deploy recorded it.
        demo_state = state_module.require(Path(env["LAB_STATE_FILE"]))
        triton = f"127.0.0.1:{demo_state.deploy['ports']['triton_http']}"
        print(f"\n$ python client_scripts/classify.py {photo} --url {triton}", flush=True)
        classified = subprocess.run(
            [sys.executable, str(config.PROJECT_ROOT / "client_scripts" / "classify.py"), str(photo), "--url", triton],
            check=False,
        )
        if classified.returncode != 0:
            raise SystemExit("demo stopped: the classification through Triton failed")
        output = fab(env, "bench", "--quick")
        report = next((line.split(": ", 1)[1] for line in output.splitlines() if line.startswith("report: ")), None)
    finally:
        fab(env, "teardown")  # the demo's own deployment: the state file is the demo's
    print(f"\nThe report of this run: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

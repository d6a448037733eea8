"""`make demo`: the whole job on the local target, as a user runs it.

fab provision --target local -> fab deploy -> a classification through Triton
-> fab bench --quick -> fab teardown (always, even after a failure), then
says where the report is.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from provision import config, sample_images
from provision import state as state_module

FAB = str(Path(sys.executable).parent / "fab")


def fab(*args: str) -> str:
    """Run `fab ARGS`, its output shown as it comes (a deploy takes minutes) and returned."""
    print(f"\n$ fab {' '.join(args)}", flush=True)
    with subprocess.Popen([FAB, *args], cwd=config.PROJECT_ROOT, stdout=subprocess.PIPE, text=True) as running:
        lines = []
        for line in running.stdout:
            print(line, end="", flush=True)
            lines.append(line)
    if running.returncode != 0:
        raise SystemExit(f"demo stopped: `fab {' '.join(args)}` failed")
    return "".join(lines)


def main() -> int:
    settings = config.settings()
    report = None
    try:
        fab("provision", "--target", "local")
        fab("deploy")
        fab("status")
        photo = config.runtime_dir(settings) / "demo.jpg"
        photo.write_bytes(sample_images.jpeg())
        # Where this deployment's Triton listens, as deploy recorded it (not the defaults: ports may be moved).
        triton = f"127.0.0.1:{state_module.require().deploy['ports']['triton_http']}"
        print(f"\n$ python client_scripts/classify.py {photo} --url {triton}", flush=True)
        classified = subprocess.run(
            [sys.executable, str(config.PROJECT_ROOT / "client_scripts" / "classify.py"), str(photo), "--url", triton],
            check=False,
        )
        if classified.returncode != 0:
            raise SystemExit("demo stopped: the classification through Triton failed")
        output = fab("bench", "--quick")
        report = next((line.split(": ", 1)[1] for line in output.splitlines() if line.startswith("report: ")), None)
    finally:
        fab("teardown")
    print(f"\nThe report of this run: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

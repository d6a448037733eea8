"""A serving host's layout, and the one way its code asks a service over HTTP.

The deploy folder (lab.deploy_dir, "home" below) holds, whatever the runtime:

    home/lib/provision/     this package's __init__.py and host/ (copied by the deploy)
    home/models/            the rendered model repository
    home/weights/           the weights the deploy copied (when the controller had them)
    home/client_scripts/    the API, the notebook, the perf input writer
    home/run/               pid files, logs, the Jupyter token, what the last deploy copied
    home/runtime.json       the runtime's settings, written by the deploy role
    home/triton/            the process runtime's tritonserver (from the nvidia-pytriton wheel)
    home/compose.yaml, build/  the docker runtime's services and image build context

Standard library only: it runs on hosts that have nothing of ours installed.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

RUN_DIR = "run"
RUNTIME_JSON = "runtime.json"
LIB_DIR = "lib"
TOKEN_FILE = f"{RUN_DIR}/jupyter.token"  # Jupyter's token: made on the host, mode 0600, never leaves it
# Each service's log under run/ (the process runtime's BackgroundProcess names them so).
LOG_FILES = {"triton": "tritonserver.log", "api": "api.log", "jupyter": "jupyter.log"}


def run_dir(home: Path) -> Path:
    return Path(home) / RUN_DIR


def reachable_address(bind_address: str) -> str:
    """Where a service bound to bind_address answers on its own host: a wildcard bind on the loopback."""
    return "127.0.0.1" if bind_address in ("0.0.0.0", "::", "") else bind_address


def http_json(url: str, method: str = "GET", body: bytes | None = None, timeout: float = 5) -> tuple[int, object]:
    """(HTTP status, the parsed JSON body or None); status 0 when nothing answers.

    A status of 4xx or 5xx is returned, not raised: the callers ask "is it up?".
    """
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, None
    except (urllib.error.URLError, OSError, ValueError):
        return 0, None
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:  # an answer, but not JSON (a health page, say)
        return status, None

"""What a cluster's load balancer (HAProxy, role load_balancer) thinks of its backends.

    python3 -m provision.host.balancer status --stats-url http://127.0.0.1:9002/stats

prints one JSON line: {"running": bool, "backends": {"triton_http": {"node-1": "UP", ...},
"triton_grpc": {...}}}, read from HAProxy's statistics page as CSV (`fab status` runs it on
the balancer's host). Standard library only: it runs on hosts that have nothing of ours installed.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import urllib.error
import urllib.request

# HAProxy's rows for a proxy as a whole, not one of its servers.
AGGREGATE_ROWS = ("FRONTEND", "BACKEND")


def parse_stats(text: str) -> dict[str, dict[str, str]]:
    """{backend: {server: its status (UP, DOWN, MAINT, 'UP 1/2'...)}} from HAProxy's stats CSV."""
    rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
    backends: dict[str, dict[str, str]] = {}
    for row in rows:
        if row["svname"] in AGGREGATE_ROWS or row["pxname"] == "stats":
            continue
        backends.setdefault(row["pxname"], {})[row["svname"]] = row["status"]
    return backends


def status(stats_url: str, timeout: float = 5) -> dict:
    try:
        with urllib.request.urlopen(f"{stats_url};csv", timeout=timeout) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return {"running": False, "backends": {}}
    return {"running": True, "backends": parse_stats(text)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["status"])
    parser.add_argument("--stats-url", required=True, help="HAProxy's statistics page, e.g. http://127.0.0.1:9002/stats")
    print(json.dumps(status(parser.parse_args().stats_url)))


if __name__ == "__main__":
    main()

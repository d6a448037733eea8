"""The `chameleon` target: a bare-metal P100 node reserved on Chameleon Cloud.

provision: key pair -> lease (node + floating IP reservation) -> ACTIVE -> server
on the reservation -> ACTIVE -> floating IP attached -> SSH answers -> hosts
recorded (user `cc`, lab.chameleon.ssh_user). The state is saved after every step, and every resource
is named before it is created (`triton-lab-<user>...`), so a provision that was
interrupted anywhere continues where it stopped (finding even a resource whose
id was never saved) and a re-run after success creates nothing.

release: server, then ad-hoc floating IPs, then the lease (which takes its
reserved floating IPs with it), each verified gone with the cloud before it
leaves the state. What the cloud refuses stays in the state, and the error
says what is left and how to retry.

All cloud calls go through provision.targets.chameleon.cloud (the only user of python-chi).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

from provision.config import settings as lab_settings
from provision.errors import UsageError
from provision.hosts import forget_host_key
from provision.state import Host, State
from provision.targets import choose_runtime
from provision.targets.chameleon.cloud import (
    LEASE_ENDING,
    LEASE_FAILED,
    ChameleonCloud,
    ChameleonError,
    LeaseNotUsable,
    NoHostsError,
    ResourceFailed,
)

Say = Callable[[str], None]
Save = Callable[[State], None]

MAX_LEASE_HOURS = 7 * 24  # Chameleon's limit for bare-metal leases

# Task flags (options) that override a setting of the same meaning.
_OPTION_NAMES = {
    "site": "site",
    "node_type": "node_type",
    "image": "image",
    "hours": "lease_hours",
    "count": "node_count",
    "key_name": "key_name",
    "public_key": "public_key",
    "private_key": "private_key",
    "user": "ssh_user",
    "floating_ip": "floating_ip",
}


def provision_flags() -> tuple[str, ...]:
    return (
        "site", "node_type", "image", "hours", "count", "key_name", "public_key", "floating_ip", "user", "key",
        "python", "lease", "start", "node", "resource_property",
    )  # fmt: skip


def config(settings: dict, options: dict | None = None) -> dict:
    """`settings["chameleon"]` over the defaults (provision/defaults.yaml `lab.chameleon`), under the task's flags."""
    merged = lab_settings({"chameleon": settings.get("chameleon") or {}})["chameleon"]
    for option, key in _OPTION_NAMES.items():
        value = (options or {}).get(option)
        if value not in (None, ""):  # a flag given, 0 too: the checks below refuse it, naming it
            merged[key] = value
    merged["lease_hours"] = float(merged["lease_hours"])
    merged["node_count"] = int(merged["node_count"])
    merged["ssh_port"] = int(merged["ssh_port"])
    if not 0 < merged["lease_hours"] <= MAX_LEASE_HOURS:
        raise UsageError(
            f"lease length {merged['lease_hours']:g} h (--hours, lab.chameleon.lease_hours): choose more than 0 and "
            f"at most {MAX_LEASE_HOURS} h (7 days)"
        )
    if merged["node_count"] < 1:
        raise UsageError(f"node count {merged['node_count']} (--count, lab.chameleon.node_count): give at least 1")
    if merged["floating_ip"] not in ("reserved", "adhoc"):
        raise UsageError(
            f"floating IP {merged['floating_ip']!r} (--floating-ip, lab.chameleon.floating_ip): "
            "use reserved (with the lease) or adhoc"
        )
    return merged


def resource_properties(given: list[str]) -> dict[str, str]:
    """--resource-property KEY=VALUE (repeatable) as {key: value}: Blazar's ["==", "$KEY", "VALUE"], all of them."""
    properties = {}
    for item in given:
        key, equals, value = item.partition("=")
        key = key.strip().removeprefix("$")
        if not equals or not key or not value.strip():
            raise UsageError(
                f"--resource-property {item!r}: use KEY=VALUE, a property of the site's hosts as the hardware "
                "browser names it (e.g. gpu.gpu_count=2)"
            )
        properties[key] = value.strip()
    return properties


def _cloud(cfg: dict, site: str | None = None, say: Say = print) -> ChameleonCloud:
    return ChameleonCloud(
        site or cfg["site"],
        poll_interval_s=float(cfg["poll_interval_s"]),
        progress_every_s=float(cfg["progress_every_s"]),
        retry=cfg.get("retry"),
        progress=say,
    )


def _slug(text: str) -> str:
    """A name part from a user name (which may be an e-mail address): lower case, letters, digits, dashes."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:40] or "user"


def _keys(cfg: dict) -> tuple[str, str | None]:
    """(public key text, private key path or None)."""
    public_path = Path(os.path.expanduser(cfg["public_key"]))
    if not public_path.is_file():
        found = [str(path) for path in sorted(Path(os.path.expanduser("~/.ssh")).glob("id_*.pub"))]
        yours = f" (yours: {', '.join(found)})" if found else ""
        raise UsageError(
            f"no public key at {public_path}: point --public-key (lab.chameleon.public_key) at yours{yours}, "
            "or make a key pair with `ssh-keygen -t ed25519` and give --public-key ~/.ssh/id_ed25519.pub"
        )
    lines = [line.strip() for line in public_path.read_text().splitlines() if line.strip()]
    if not lines or not lines[0].startswith(("ssh-", "ecdsa-")):
        raise UsageError(f"{public_path} is not an OpenSSH public key (it should start with ssh-ed25519 or ssh-rsa)")
    if cfg["private_key"]:
        private = os.path.abspath(os.path.expanduser(cfg["private_key"]))
        if not os.path.isfile(private):
            raise UsageError(f"the private key {private} does not exist: check --private-key")
    else:
        guess = str(public_path)[: -len(".pub")] if str(public_path).endswith(".pub") else ""
        private = os.path.abspath(guess) if guess and os.path.isfile(guess) else None
    return lines[0], private


def _say_step(say: Say, text: str) -> None:
    say(f"chameleon: {text}")


# -- provision ------------------------------------------------------------------


def provision(settings: dict, options: dict, state: State | None, save: Save, say: Say) -> State:
    """Reserve and launch the node(s); return the state with the hosts recorded."""
    cfg = config(settings, options)
    nodes = list(dict.fromkeys(options.get("node") or []))  # --node, repeatable: these nodes, one host each
    properties = resource_properties(options.get("resource_property") or [])
    if nodes:
        cfg["node_count"] = len(nodes)
    runtime = choose_runtime("chameleon", settings, options.get("runtime") or "")
    if options.get("start"):
        _asked_start(options["start"])  # a --start that is no time is refused before the cloud is asked anything
    cloud = _cloud(cfg, say=say)  # first: missing credentials are the most likely problem, and name what to set
    public_key, private_key = _keys(cfg)
    recorded = state.chameleon if state is not None and state.target == "chameleon" else {}
    asked_lease = options.get("lease") or ""
    _check_asked_as_recorded(recorded, {**cfg, "nodes": nodes, "resource_properties": properties}, asked_lease)
    if state is None or state.target != "chameleon":
        state = State(target="chameleon", runtime=runtime, serving_venv=options.get("serving_venv") or None)
    info = state.chameleon
    if not info.get("name"):
        info["name"] = f"{cfg['name_prefix']}-{_slug(cloud.user_name())}"
    name = info["name"]
    for key in ("site", "node_type", "image", "flavor", "network", "node_count", "floating_ip", "ssh_port"):
        info.setdefault(key, cfg[key])
    info.setdefault("nodes", nodes)
    info.setdefault("resource_properties", properties)
    info.setdefault("key_name", cfg["key_name"] or name)
    info.setdefault("lease", {"name": name})
    info.setdefault("servers", [])
    info.setdefault("floating_ips", [])  # ad-hoc ones only: reserved IPs belong to the lease
    save(state)
    created: list[str] = []

    def resume_hint(error: Exception) -> ChameleonError:
        return ChameleonError(
            f"{error}\nthe state keeps what exists: run `fab provision --target chameleon` again to continue "
            "where it stopped, or `fab teardown` to release everything"
        )

    try:
        # The lease asked for first: a name that is no lease of yours is said before anything is uploaded.
        if asked_lease and not info["lease"].get("id"):
            _adopt_lease(cloud, state, save, say, asked_lease)
        if cloud.ensure_keypair(info["key_name"], public_key):
            created.append(f"key pair {info['key_name']}")
            _say_step(say, f"uploaded your public key as key pair {info['key_name']}")
        if options.get("start") and not info["lease"].get("id") and not info["lease"].get("start"):
            info["lease"]["start"] = _start_time(options["start"], cloud, info, cfg, say).isoformat()
            save(state)
        if not _provision_lease(cloud, cfg, state, save, say, created, bool(options.get("wait_for_start"))):
            if created:
                state.record(f"provisioned on {info['site']}: {', '.join(created)}")
            save(state)
            return state  # booked ahead: no host yet
        for index in range(info["node_count"]):
            _provision_server(cloud, cfg, state, save, say, created, index, private_key)
    except (NoHostsError, LeaseNotUsable):
        raise  # nothing is held (the lease was cleaned up, or is not ours): the message says what to do
    except ChameleonError as error:
        raise resume_hint(error) from None

    state.hosts = _hosts(info, cfg["ssh_user"], private_key, options.get("python") or None)
    if created:
        state.record(f"provisioned on {info['site']}: {', '.join(created)}")
        _say_step(say, f"{len(state.hosts)} node(s) ready: " + ", ".join(f"{h.user}@{h.address}" for h in state.hosts))
    else:
        _say_step(say, "already provisioned: nothing new was created")
    save(state)
    return state


def _check_asked_as_recorded(recorded: dict, asked: dict, asked_lease: str) -> None:
    """UsageError where a provision continued asks for another lease, or for a lease we made, other
    site, node type, count, nodes or properties than it was made with."""
    held_lease = recorded.get("lease", {})
    if asked_lease and held_lease.get("id") and asked_lease not in (held_lease["id"], held_lease.get("name")):
        raise UsageError(
            f"already provisioned on lease {held_lease.get('name')} ({held_lease['id']}): run `fab teardown` "
            f"first to work on lease {asked_lease}, or drop --lease to continue"
        )
    if not (held_lease.get("id") and held_lease.get("ours", True)):
        return  # a lease the user brought is taken as it is
    labels = (("site", "site"), ("node_type", "node type"), ("node_count", "node count"), ("nodes", "nodes"),
              ("resource_properties", "resource properties"))  # fmt: skip
    for key, label in labels:
        if key in ("nodes", "resource_properties") and not asked[key]:
            continue  # not given again: the recorded ones
        if recorded.get(key) is not None and recorded[key] != asked[key]:
            raise UsageError(
                f"already provisioned with {label} {recorded[key]} (asked: {asked[key]}): "
                "run `fab teardown` first to change it, or drop the flag to continue"
            )


def _hosts(info: dict, user: str, private_key: str, python: str | None) -> list[Host]:
    """The launched servers as hosts, reached over SSH at their floating IPs."""
    return [
        Host(
            name=server["name"],
            address=server["floating_ip"],
            port=info["ssh_port"],
            user=user,
            key=private_key,
            connection="ssh",
            python=python,
            private_address=server.get("fixed_ip"),  # the shared network the nodes have in common
        )
        for server in info["servers"]
    ]


def booked_ahead(state: State) -> dict:
    """The lease, when it is booked ahead and has not started (as recorded)."""
    lease = state.chameleon.get("lease") or {}
    start = lease.get("start")
    if not lease.get("id") or lease.get("status") != "PENDING" or not start:
        return {}
    if datetime.fromisoformat(start) <= datetime.now(timezone.utc):
        return {}
    return {"lease": f"lease {lease['name']} (booked from {_when(start)})", "ours": lease.get("ours", True)}


def held(state: State) -> str:
    """What the state says exists (or may exist) on the cloud, in one line: what an interrupted provision prints."""
    info = state.chameleon
    parts = []
    lease = info.get("lease") or {}
    if lease.get("id"):
        parts.append(f"lease {lease['name']} ({lease['id']}, {lease.get('status', 'status unknown')})")
    elif lease.get("create_sent"):
        parts.append(f"lease {lease['name']} (asked for; Blazar's answer did not come)")
    for server in info.get("servers", []):
        parts.append(
            f"server {server['name']}"
            + (f" ({server.get('status', 'BUILD')})" if server.get("id") else " (launch sent)")
        )
    for fip in info.get("floating_ips", []):
        parts.append(f"floating IP {fip['address']}")
    return f"on {info.get('site')}: " + ", ".join(parts) if parts else "nothing reserved yet"


def _adopt_lease(cloud: ChameleonCloud, state: State, save: Save, say: Say, reference: str) -> None:
    """Work on a lease the user holds (--lease NAME_OR_ID): check it, take its node type, count and
    floating IP pool from it, and record it as not ours (teardown leaves it)."""
    info = state.chameleon
    found = cloud.lease_by_reference(reference)
    where = f"at {info['site']}"
    if found is None:
        names = cloud.lease_names()
        raise LeaseNotUsable(
            f"no lease {reference!r} {where}: your project's leases there: {', '.join(names) or 'none'}. Give its "
            "name or id as the dashboard shows it (Reservations > Leases), or --site for a lease at another site"
        )
    label = f"lease {found['name']} ({found['id']})"
    if found["status"] in LEASE_ENDING | {LEASE_FAILED}:
        raise LeaseNotUsable(
            f"{label} {where} is {found['status']} (its end: {found['end']}): book a new one in the dashboard and "
            "give it to --lease, or leave out --lease and provision makes one now"
        )
    if not found["node_reservation_id"]:
        raise LeaseNotUsable(
            f"{label} {where} reserves no node (its reservations: {', '.join(found['reservation_kinds']) or 'none'}): "
            "give a lease with a host reservation (a node type, or a node by name)"
        )
    info["lease"] = {**found, "ours": False}
    info["node_type"] = found["node_type"] or info["node_type"]
    info["node_count"] = found["node_count"]
    info["floating_ip"] = "reserved" if found["fip_reservation_id"] else "adhoc"
    state.record(f"working on {label}, not ours: teardown leaves it")
    save(state)
    kind = f"{found['node_count']} x {found['node_type'] or 'node'}"
    addresses = "its reserved floating IPs" if found["fip_reservation_id"] else "ad-hoc floating IPs (it reserves none)"
    _say_step(say, f"using your {label}: {kind}, {found['status']}, ends {found['end']}; {addresses}")


def _start_time(asked: str, cloud: ChameleonCloud, info: dict, cfg: dict, say: Say) -> datetime:
    """--start: "YYYY-MM-DD HH:MM" in this machine's time zone, or "earliest" (the next free slot
    for the node type, count and hours, from Blazar's allocations); as an aware UTC time."""
    now = datetime.now(timezone.utc)
    start = _asked_start(asked)
    if start is None:
        slot = cloud.next_free_slot(info["node_type"], info["node_count"], cfg["lease_hours"])
        if slot is None:
            raise UsageError(
                f"--start earliest: Blazar's calendar at {info['site']} has no {info['node_count']} x "
                f"{info['node_type']} to book: choose --node-type, or --start with a time"
            )
        # Blazar takes minutes: the slot's minute rounded up, so the lease does not touch the one before.
        start = max(slot, now + timedelta(minutes=2))
        start = start.replace(second=0, microsecond=0) + timedelta(minutes=1 if start.second or start.microsecond else 0)
        _say_step(say, f"the earliest slot for {info['node_count']} x {info['node_type']}: {start:%Y-%m-%d %H:%M} UTC")
        return start
    return start


def _asked_start(asked: str) -> datetime | None:
    """--start read alone: None for "earliest" (a slot the cloud names), else the time asked, in UTC;
    UsageError for anything else, or for a time that is not in the future."""
    if asked.strip().lower() == "earliest":
        return None
    try:
        local = datetime.strptime(asked.strip(), "%Y-%m-%d %H:%M")
    except ValueError:
        raise UsageError(f'--start {asked!r}: use "YYYY-MM-DD HH:MM" (your time zone) or earliest') from None
    start = local.astimezone(timezone.utc)  # a naive time is this machine's local time
    if start <= datetime.now(timezone.utc):
        raise UsageError(
            f"--start {asked} ({start:%Y-%m-%d %H:%M} UTC) is not in the future: leave it out to start now"
        )
    return start


def _when(start: str) -> str:
    """A lease's start for the user: UTC, this machine's local time, and how long until then."""
    at = datetime.fromisoformat(start)
    seconds = max(0, int((at - datetime.now(timezone.utc)).total_seconds()))
    hours, rest = divmod(seconds, 3600)
    return f"{at:%Y-%m-%d %H:%M} UTC ({at.astimezone():%Y-%m-%d %H:%M %Z} here, in {hours} h {rest // 60:02d} min)"


def _provision_lease(
    cloud: ChameleonCloud, cfg: dict, state: State, save: Save, say: Say, created: list[str], wait: bool = False
) -> bool:
    """Make or check the lease; True once it is ACTIVE. A lease booked ahead (PENDING, its start to
    come) returns False, saying when it starts, unless `wait`: then it waits for the start."""
    info = state.chameleon
    lease = info["lease"]
    if lease.get("id"):
        current = _recorded_lease(cloud, lease)
    else:
        current = cloud.find_lease(lease["name"])  # created by a run that stopped before saving its id
        if current is not None:
            _say_step(say, f"found lease {current['name']} from an earlier run ({current['status']})")
        else:
            current = _create_lease(cloud, cfg, state, save, say)
            created.append(f"lease {current['name']}")
        lease.update(current)
        save(state)
    return _wait_for_the_lease(cloud, cfg, state, save, say, current, wait)


def _recorded_lease(cloud: ChameleonCloud, lease: dict) -> dict:
    """The recorded lease as Blazar has it now; an error where it has ended or is gone."""
    current = cloud.lease(lease["id"])
    if current is None or current["status"] in LEASE_ENDING:
        if not lease.get("ours", True):
            raise LeaseNotUsable(
                f"your lease {lease['name']} ({lease['id']}) has ended or was deleted: run `fab teardown` to "
                "clear it here, then provision on another (--lease) or on a new one"
            )
        raise ChameleonError(
            f"lease {lease['name']} ({lease['id']}) has ended or was deleted: run `fab teardown` to clear it, "
            "then `fab provision --target chameleon` for a new one"
        )
    return current


def _create_lease(cloud: ChameleonCloud, cfg: dict, state: State, save: Save, say: Say) -> dict:
    """Ask Blazar for the lease; where the answer is lost but the lease exists, continue with it."""
    info = state.chameleon
    lease = info["lease"]
    count, node_type = info["node_count"], info["node_type"]
    what = f"node(s) {', '.join(info['nodes'])}" if info.get("nodes") else f"{count} x {node_type}"
    if info.get("resource_properties"):
        what += " with " + ", ".join(f"{k}={v}" for k, v in info["resource_properties"].items())
    _say_step(
        say, f"reserving {what} at {info['site']} for {cfg['lease_hours']:g} h (lease {lease['name']})"
    )
    # Until Blazar says otherwise a lease of this name may exist (a create
    # whose answer was lost): the state keeps the name, teardown looks it up.
    lease["create_sent"] = True
    save(state)
    try:
        current = cloud.create_lease(
            lease["name"],
            node_type,
            count,
            cfg["lease_hours"],
            start=datetime.fromisoformat(lease["start"]) if lease.get("start") else None,
            reserve_floating_ip=info["floating_ip"] == "reserved",
            node_names=info.get("nodes") or (),
            properties=info.get("resource_properties") or {},
        )
    except NoHostsError:
        lease.pop("create_sent", None)  # Blazar refused: nothing was made
        save(state)
        raise
    except ChameleonError as error:
        current = cloud.find_lease(lease["name"])  # not repeated blindly: was it made?
        if current is None:  # Blazar has no such lease: nothing to clean up
            lease.pop("create_sent", None)
            save(state)
            raise
        _say_step(
            say, f"the lease create failed ({error}), but lease {lease['name']} exists: continuing with it"
        )
    lease.pop("create_sent", None)
    return current


def _wait_for_the_lease(
    cloud: ChameleonCloud, cfg: dict, state: State, save: Save, say: Say, current: dict, wait: bool
) -> bool:
    """True once the lease is ACTIVE; False for one booked ahead, unless `wait` (then wait for its start)."""
    lease = state.chameleon["lease"]
    timeout_s = float(cfg["timeouts"]["lease_active_s"])
    to_start = (datetime.fromisoformat(current["start"]) - datetime.now(timezone.utc)).total_seconds()
    if current["status"] == "PENDING" and to_start > 0:  # booked ahead
        lease.update(current)
        state.record(f"lease {lease['name']} booked from {current['start']}")
        save(state)
        if not wait:
            _say_step(
                say,
                f"lease {lease['name']} is booked: it starts {_when(current['start'])}. Run `fab provision "
                "--target chameleon` again after its start to launch the server(s); `fab status` shows the wait",
            )
            return False
        _say_step(say, f"waiting for lease {lease['name']} to start {_when(current['start'])}")
        timeout_s += to_start
    if current["status"] != "ACTIVE":
        try:
            current = cloud.wait_lease_active(current["id"], timeout_s, lambda m: _say_step(say, m), label=lease["name"])
        except ResourceFailed as error:
            _discard_failed_lease(cloud, cfg, state, save, say)
            if error.status == LEASE_FAILED:  # Blazar accepted the lease, then could not start it
                raise ChameleonError(
                    f"{error}; the lease was deleted and verified gone. Blazar reports a failure of the lease itself "
                    "(not a lack of free nodes): run `fab provision --target chameleon` again, and if it fails the same "
                    "way, ask the site's help desk with this message"
                ) from None
            raise ChameleonError(f"{error} while starting; run `fab provision --target chameleon` again") from None
    lease.update(current)
    state.record(f"lease {lease['name']} ACTIVE until {lease['end']}")
    save(state)
    return True


def _discard_failed_lease(cloud: ChameleonCloud, cfg: dict, state: State, save: Save, say: Say) -> None:
    """A lease in ERROR (or ended) holds nothing useful: delete it, verify, forget it."""
    lease = state.chameleon["lease"]
    _say_step(say, f"lease {lease['name']} failed: deleting it")
    cloud.delete_lease(lease["id"])
    _wait_gone(f"lease {lease['id']}", lambda: cloud.lease_exists(lease["id"]), cfg)
    state.chameleon["lease"] = {"name": lease["name"]}
    state.record(f"lease {lease['name']} failed; deleted and verified gone")
    save(state)


def _provision_server(cloud, cfg, state, save, say, created, index, private_key) -> None:
    info = state.chameleon
    lease = info["lease"]
    name = f"{info['name']}-node{index + 1}"
    servers = info["servers"]
    if len(servers) <= index:
        servers.append({"name": name})
        save(state)  # the name first: a run stopped right after the create still finds the server
    entry = servers[index]
    current = cloud.server(entry["id"]) if entry.get("id") else None
    if current is None:
        current = cloud.find_server(name)
        if current is not None:
            _say_step(say, f"found server {name} from an earlier run ({current['status']})")
        else:
            reservations = lease.get("node_reservation_ids") or [lease["node_reservation_id"]]
            reservation = reservations[index] if index < len(reservations) else reservations[0]  # one per --node
            _say_step(say, f"launching {name} ({info['image']}) on reservation {reservation}")
            current = cloud.create_server(
                name, reservation, info["image"], info["flavor"], info["key_name"], info["network"]
            )
            created.append(f"server {name}")
        entry.update(id=current["id"], status=current["status"])
        save(state)
    if current["status"] != "ACTIVE":
        _say_step(say, f"waiting for {name} to become ACTIVE (bare metal takes 10-20 min)")
        try:
            current = cloud.wait_server_active(
                current["id"], cfg["timeouts"]["server_active_s"], lambda m: _say_step(say, m), label=name
            )
        except ResourceFailed as error:
            # A server that failed to deploy is of no use and blocks the node: delete it, keep the lease.
            cloud.delete_server(entry["id"])
            _wait_gone(f"server {name}", lambda: cloud.server_exists(entry["id"]), cfg)
            servers[index] = {"name": name}
            state.record(f"server {name} went to {error.status}; deleted and verified gone")
            save(state)
            raise ChameleonError(
                f"server {name} failed to deploy ({error}); it was deleted, the lease is kept"
            ) from None
    entry.update(status="ACTIVE", fixed_ip=(current["fixed_ips"] or [None])[0])
    save(state)
    _attach_floating_ip(cloud, state, save, say, created, entry, current)
    if not entry.get("ssh"):
        banner = cloud.wait_for_ssh(
            entry["floating_ip"], info["ssh_port"], cfg["timeouts"]["ssh_s"], lambda m: _say_step(say, m)
        )
        _say_step(say, f"{entry['floating_ip']}:{info['ssh_port']} answers SSH ({banner})")
        entry["ssh"] = True
        save(state)


def _attach_floating_ip(cloud, state, save, say, created, entry, current) -> None:
    info = state.chameleon
    if entry.get("floating_ip") and entry["floating_ip"] in current["floating_ips"]:
        return  # attached by an earlier run
    if not entry.get("floating_ip"):
        taken = {s.get("floating_ip") for s in info["servers"] if s is not entry}
        if info["floating_ip"] == "reserved":
            reserved = cloud.reserved_floating_ips(info["lease"]["fip_reservation_id"])
            free = sorted(f["address"] for f in reserved if f["address"] not in taken)
            if free:
                entry.update(floating_ip=free[0], floating_ip_source="lease")
            elif not reserved or info["lease"].get("ours", True):
                raise ChameleonError(
                    f"lease {info['lease']['name']} is ACTIVE but Blazar has not created its reserved floating IP yet: "
                    "wait a minute"
                )
            # else: the user's lease reserved fewer addresses than it has nodes: an ad-hoc one for this node
        if not entry.get("floating_ip"):
            described = [f for f in cloud.floating_ips_described(entry["name"]) if f["address"] not in taken]
            fip = described[0] if described else cloud.allocate_floating_ip(entry["name"])
            if not described:
                created.append(f"floating IP {fip['address']}")
            info["floating_ips"].append({"id": fip["id"], "address": fip["address"], "server": entry["name"]})
            entry.update(floating_ip=fip["address"], floating_ip_source="adhoc")
        save(state)
    if forget_host_key(entry["floating_ip"], info["ssh_port"]):  # before the first SSH to the new node
        _say_step(say, f"forgot the old host key of {entry['floating_ip']} (an earlier node had this address)")
    _say_step(say, f"attaching floating IP {entry['floating_ip']} to {entry['name']}")
    cloud.associate_floating_ip(entry["id"], entry["floating_ip"])
    state.record(f"floating IP {entry['floating_ip']} attached to {entry['name']}")
    save(state)


def _wait_gone(what: str, exists: Callable[[], bool], cfg: dict) -> None:
    """Poll until the cloud no longer has it; raise ChameleonError if it stays."""
    deadline = time.monotonic() + float(cfg["timeouts"]["delete_s"])
    while exists():
        if time.monotonic() >= deadline:
            raise ChameleonError(f"{what} is still there {cfg['timeouts']['delete_s']} s after its deletion")
        time.sleep(float(cfg["poll_interval_s"]))


# -- release --------------------------------------------------------------------


def release(state: State, settings: dict, save: Save, say: Say, options: dict | None = None) -> None:
    """Delete the servers, ad-hoc floating IPs and the lease; verify each is gone before forgetting it.

    A lease the user brought (--lease) stays, unless options["release_lease"] (`fab teardown --release-lease`).
    """
    info = state.chameleon
    if not info or not (info.get("lease") or info.get("servers") or info.get("floating_ips")):
        say("chameleon: nothing reserved")
        return
    cfg = config(settings)
    cloud = _cloud(cfg, info.get("site"), say)
    left = _release_servers(cloud, cfg, state, save, say)
    left += _release_floating_ips(cloud, cfg, state, save, say)
    lease = info.get("lease") or {}
    kept_lease = bool(lease) and not lease.get("ours", True) and not (options or {}).get("release_lease")
    if kept_lease:
        if not left:  # its servers are gone: the lease is the user's again
            info.pop("lease", None)
            state.record(f"left lease {lease['name']}: not ours")
            save(state)
            _say_step(
                say,
                f"left your lease {lease['name']} ({lease['id']}) as it is: it ends {lease.get('end')}; "
                "`fab teardown --release-lease` deletes it with the rest, or delete it in the dashboard",
            )
    elif lease:
        left += _release_lease(cloud, cfg, state, save, say)

    if left:
        raise ChameleonError(
            f"could not release everything on {info.get('site')}; still there:\n  - "
            + "\n  - ".join(left)
            + "\nthe state keeps them: run `fab teardown` again to retry (it continues where it stopped), or delete them "
            "in the web UI (Compute > Instances, Network > Floating IPs, Reservations > Leases)"
        )
    state.hosts = []
    if kept_lease:
        _say_step(say, f"released what provision made on {info.get('site')} (verified with the cloud); your lease stays")
    else:
        _say_step(say, f"released everything on {info.get('site')} (verified with the cloud)")


def _release_servers(cloud: ChameleonCloud, cfg: dict, state: State, save: Save, say: Say) -> list[str]:
    """Delete each server and verify it gone; what could not be released, with why."""
    info, left = state.chameleon, []
    for entry in list(info.get("servers", [])):
        try:
            server_id = entry.get("id") or (cloud.find_server(entry["name"]) or {}).get("id")
            if server_id:
                _say_step(say, f"deleting server {entry['name']}")
                cloud.delete_server(server_id)
                _wait_gone(f"server {entry['name']}", lambda sid=server_id: cloud.server_exists(sid), cfg)
            info["servers"].remove(entry)
            state.hosts = [h for h in state.hosts if h.name != entry["name"]]
            state.record(f"server {entry['name']} deleted and verified gone")
            save(state)
        except ChameleonError as error:
            left.append(f"server {entry['name']} ({entry.get('id') or 'id unknown'}): {error}")
    return left


def _release_floating_ips(cloud: ChameleonCloud, cfg: dict, state: State, save: Save, say: Say) -> list[str]:
    """Release the ad-hoc floating IPs, also ones whose id a stopped run never saved (found by their
    description), and verify each gone; what could not be released, with why."""
    info, left, orphans = state.chameleon, [], []
    if info.get("floating_ip") == "adhoc":
        known = {f["address"] for f in info.get("floating_ips", [])}
        names = {f"{info['name']}-node{i + 1}" for i in range(int(info.get("node_count") or 1))}
        for name in sorted(names):
            try:
                orphans += [
                    dict(f, server=name) for f in cloud.floating_ips_described(name) if f["address"] not in known
                ]
            except ChameleonError as error:
                left.append(f"floating IPs of {name} (not listed): {error}")
        info.setdefault("floating_ips", []).extend(orphans)
    for fip in list(info.get("floating_ips", [])):
        try:
            _say_step(say, f"releasing floating IP {fip['address']}")
            cloud.deallocate_floating_ip(fip["address"])
            _wait_gone(f"floating IP {fip['address']}", lambda a=fip["address"]: cloud.floating_ip(a) is not None, cfg)
            info["floating_ips"].remove(fip)
            state.record(f"floating IP {fip['address']} released and verified gone")
            save(state)
        except ChameleonError as error:
            left.append(f"floating IP {fip['address']}: {error}")
    return left


def _release_lease(cloud: ChameleonCloud, cfg: dict, state: State, save: Save, say: Say) -> list[str]:
    """Delete the lease (its nodes and reserved floating IPs go with it) and verify it gone; [] or why not."""
    info = state.chameleon
    lease = info["lease"]
    try:
        lease_id = lease.get("id") or (cloud.find_lease(lease["name"]) or {}).get("id")
        if lease_id:
            _say_step(say, f"deleting lease {lease['name']} (its node and reserved floating IPs go with it)")
            cloud.delete_lease(lease_id)
            _wait_gone(f"lease {lease['name']}", lambda: cloud.lease_exists(lease_id), cfg)
            if lease.get("fip_reservation_id"):
                _wait_gone(
                    f"the floating IPs reserved by lease {lease['name']}",
                    lambda: bool(cloud.reserved_floating_ips(lease["fip_reservation_id"])),
                    cfg,
                )
        info.pop("lease", None)
        state.record(f"lease {lease['name']} deleted and verified gone")
        save(state)
    except ChameleonError as error:
        return [f"lease {lease['name']} ({lease.get('id') or 'id unknown'}): {error}"]
    return []


# -- status and extend -------------------------------------------------------------


def _time_left(end: str | None) -> tuple[float | None, str]:
    if not end:
        return None, "unknown"
    seconds = (datetime.fromisoformat(end) - datetime.now(timezone.utc)).total_seconds()
    if seconds <= 0:
        return 0.0, "ended"
    hours, rest = divmod(int(seconds), 3600)
    return seconds, f"{hours} h {rest // 60:02d} min"


def status(state: State, settings: dict) -> dict:
    """The lease (status, end, time left), each server's status and address, as the cloud reports now."""
    info = state.chameleon
    lease = info.get("lease") or {}
    result = {
        "site": info.get("site"),
        "lease": {"name": lease.get("name"), "id": lease.get("id"), "ours": lease.get("ours", True)},
        "servers": [],
    }
    try:
        cloud = _cloud(config(settings), info.get("site"))
        current = cloud.lease(lease["id"]) if lease.get("id") else None
        if current is not None:
            lease = {**lease, **current}
        result["lease"].update(
            status=current["status"] if current else ("GONE" if lease.get("id") else "not created"),
            start=lease.get("start"),
            end=lease.get("end"),
        )
        for entry in info.get("servers", []):
            server = cloud.server(entry["id"]) if entry.get("id") else None
            result["servers"].append(
                {
                    "name": entry["name"],
                    "status": server["status"] if server else "GONE",
                    "floating_ip": entry.get("floating_ip"),
                    "fixed_ip": entry.get("fixed_ip"),
                }
            )
    except ChameleonError as error:
        result["error"] = str(error)
    seconds, text = _time_left(lease.get("end"))
    result["lease"].update(time_left_s=seconds, time_left=text)
    return result


def default_runtime(settings: dict) -> str:
    """docker (lab.chameleon.runtime): the node's GPUs run the pinned CUDA images."""
    return (settings.get("chameleon") or {}).get("runtime") or "docker"


def serving_pins(settings: dict, state: State) -> tuple[str, str]:
    """The P100's torch: a cu126 build that still has sm_60 kernels (lab.chameleon.constraints)."""
    chameleon = settings.get("chameleon") or {}
    return chameleon.get("constraints", "constraints/p100.txt"), chameleon.get("pip_extra_args", "")


def release_deletes_hosts() -> bool:
    """The servers are deleted with everything on them: a failed clean-up of the hosts does not stop teardown."""
    return True


def holds_nothing(state: State) -> bool:
    """A provision that failed before creating anything leaves only names: nothing to release.

    A lease create that went out without a clear answer may have made one: its
    name stays, so that `fab teardown` looks it up and releases it.
    """
    info = state.chameleon
    lease = info.get("lease", {})
    return not (lease.get("id") or lease.get("create_sent") or info.get("servers") or info.get("floating_ips"))


def status_lines(state: State, settings: dict) -> list[str]:
    """The lease (status, end, time left, a warning under an hour) and each server, as the cloud says now."""
    report = status(state, settings)
    lines = [f"chameleon: {report['error']}"] if report.get("error") else []
    lease = report.get("lease") or {}
    if lease:
        yours = "" if lease.get("ours", True) else " (yours: teardown leaves it)"
        lines.append(
            f"lease {lease.get('name')}{yours} on {report.get('site')}: {lease.get('status')}, "
            f"ends {lease.get('end')} ({lease.get('time_left')} left)"
        )
    start = lease.get("start")
    if lease.get("status") == "PENDING" and start and datetime.fromisoformat(start) > datetime.now(timezone.utc):
        lines.append(
            f"booked ahead: the lease starts {_when(start)}; then `fab provision --target chameleon` "
            "launches the server(s)"
        )
    for server in report.get("servers", []):
        lines.append(f"server {server['name']}: {server['status']}, floating IP {server.get('floating_ip')}")
    left = lease.get("time_left_s")
    if left is not None and left < 3600:
        lines.append(
            f"warning: the lease ends in {lease.get('time_left')}: when it ends the node and what is on it go; "
            "run `fab extend --hours 1` to keep it"
        )
    return lines


def deadline(state: State, settings: dict) -> datetime | None:
    """When the hosts go away: the lease's end as Blazar says now (an extension made from
    another terminal counts), or the end recorded at provision when the cloud cannot be asked."""
    lease = state.chameleon.get("lease") or {}
    end = lease.get("end")
    if lease.get("id"):
        try:
            current = _cloud(config(settings), state.chameleon.get("site")).lease(lease["id"])
        except ChameleonError:
            current = None
        end = (current or {}).get("end") or end
    return datetime.fromisoformat(end) if end else None


def extend(state: State, settings: dict, hours: int, save: Save, say: Say) -> None:
    """Move the lease's end `hours` later."""
    lease = state.chameleon.get("lease") or {}
    if not lease.get("id"):
        raise UsageError("no lease to extend: run `fab provision --target chameleon` first")
    if not 0 < float(hours) <= MAX_LEASE_HOURS:
        raise UsageError(f"--hours {hours}: choose more than 0 and at most {MAX_LEASE_HOURS}")
    cloud = _cloud(config(settings), state.chameleon.get("site"))
    updated = cloud.extend_lease(lease["id"], float(hours))
    lease.update(updated)
    state.record(f"lease {lease['name']} extended by {hours} h to {lease['end']}")
    save(state)
    _, left = _time_left(lease["end"])
    say(f"chameleon: lease {lease['name']} now ends {lease['end']} ({left} left)")


def record_problems(record: dict) -> list[str]:
    """What makes a state's chameleon record unusable (a hand-edited file): [] when it is fine."""
    kinds = {"lease": (dict, "an object"), "servers": (list, "a list"), "floating_ips": (list, "a list")}
    problems = [
        f'"chameleon.{name}" is not {words}'
        for name, (kind, words) in kinds.items()
        if name in record and not isinstance(record[name], kind)
    ]
    for name in ("servers", "floating_ips"):
        entries = record.get(name) if isinstance(record.get(name), list) else []
        problems += [f'"chameleon.{name}" holds {entry!r}, not an object' for entry in entries if not isinstance(entry, dict)]
    return problems


def recorded_resources(record: dict) -> list[str]:
    """The lease, servers and floating IPs a state's record names (as far as it can be read), a line each."""
    lines = []
    site, lease = record.get("site"), record.get("lease")
    if isinstance(lease, dict) and (lease.get("id") or lease.get("name")):
        where = f" at {site}" if site else ""
        lines.append(f"lease {lease.get('name', '?')} (id {lease.get('id', 'not recorded')}){where}")
    for kind, label in (("servers", "server"), ("floating_ips", "floating IP")):
        for entry in record.get(kind) if isinstance(record.get(kind), list) else []:
            if isinstance(entry, dict):
                name = entry.get("name") or entry.get("address") or "?"
                lines.append(f"{label} {name} (id {entry.get('id', 'not recorded')})")
    return lines

"""Our small interface to Chameleon Cloud: the only module that imports python-chi (`chi`).

Everything the chameleon target does with the cloud goes through `ChameleonCloud`,
whose methods take and return plain values (ids, addresses, dicts of our own), so
the stage logic in provision/targets/chameleon/__init__.py never sees a python-chi object
and python-chi's quirks are handled here, once. python-chi 1.2.10 pitfalls met
(read in its source, and met against a fake OpenStack) and what this module does about them:

- `pip install python-chi` does not bring blazarclient, so `chi.lease` fails to
  import: the project depends on python-blazarclient, and a missing one is
  reported with the command that installs it.
- Credentials are read from the environment when `chi` is imported: we check
  them first (`check_credentials`, naming the missing or wrong variable) and call
  `chi.context.reset()` so the environment of *this* call is used.
  `chi.use_site()` is not used: it fetches sites.json from the internet, forces
  port 5000, and on failure only prints and returns. The RC file's OS_AUTH_URL
  and OS_REGION_NAME already say which site.
- `Lease.submit()` swallows the API's error ("Not enough hosts available", a name
  conflict) into `ResourceError("Unable to make lease")` and only logs the
  reason: we build the reservations with `chi.lease.Lease` but send them with
  `chi.blazar().lease.create()`, which raises with Blazar's own message.
- `Lease.wait()` / `Server.wait()` return normally when the resource goes to
  ERROR, print to stdout and sleep 5 s between polls: we poll ourselves,
  treat ERROR as a failure and report elapsed time and status changes.
- `Server.submit(show="widget")` (the default) raises after the server was
  created outside Jupyter: we pass `show=None`, `wait_for_active=False`.
- `Server.submit()` does not return the new server's id and python-chi finds
  servers by name (several with one name break it): names are derived from the
  user and unique, we look the id up once and then use ids only.
- `Server(key_name=...)` accepts a key pair that does not exist (the server
  then fails): `ensure_keypair` runs first.
- `associate_floating_ip(port_id=...)` never associates (it always raises), and
  without port_id it hides Neutron's error: we find the server's port and bind
  the address with `chi.network.bind_floating_ip`, which raises the real error.
- `Server.delete(delete_ips=True)` (the default) deletes floating IPs through a
  wrong URL and leaks them silently: we delete with `delete_ips=False` and
  release an ad-hoc IP with `chi.network.deallocate_floating_ip`. An IP that a
  lease reserved is never deallocated: Blazar takes it back with the lease.
- `chi.network.get_free_floating_ip()` hands out *any* unattached IP of the
  project, possibly another user's: we never use it.
- `chi.hardware` (next free slot) calls `host.list_allocations()`, which
  blazarclient 4.6 lacks: we read `allocation.list("os-hosts")` ourselves.
- The deprecated functional helpers (`chi.lease.wait_for_active`,
  `get_node_reservation`) raise in 1.2.x: not used.

Transient faults (HTTP 500/502/503/504, a 409 on a delete, a dropped or timed
out connection) are retried inside the command, with bounded exponential
backoff and one progress line per retry, for the calls that are safe to repeat:
reads, deletes and lease updates (`_call(..., repeat=...)`). Creates are never
repeated blindly: the caller looks the resource up by name first.

Credentials never leave the environment: nothing here writes them anywhere, and
error messages name variables, never their values.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone

from provision import interrupts
from provision.errors import OperationError

Progress = Callable[[str], None]

# Where users get credentials, per site (the site's own dashboard).
DASHBOARDS = {
    "CHI@TACC": "https://chi.tacc.chameleoncloud.org",
    "CHI@UC": "https://chi.uc.chameleoncloud.org",
    "KVM@TACC": "https://kvm.tacc.chameleoncloud.org",
}

# Blazar's lease statuses (blazar/status.py), in one place. "DELETED" is not
# one: python-chi sets it locally after its own delete call.
LEASE_STATUSES = (
    "PENDING",
    "CREATING",
    "STARTING",
    "ACTIVE",
    "UPDATING",
    "TERMINATING",
    "TERMINATED",
    "DELETING",
    "ERROR",
)
LEASE_ENDING = {"TERMINATING", "TERMINATED", "DELETING"}  # never adopted nor waited on
LEASE_FAILED = "ERROR"

# Blazar's API dates: UTC, to the minute.
BLAZAR_DATE = "%Y-%m-%d %H:%M"

# What a retry waits, unless lab.chameleon.retry says otherwise.
# Where each GPU node type is (Chameleon's hardware catalogue; only what advice needs). The
# P100s are at CHI@TACC only: "another site" is no advice for them.
NODE_TYPE_SITES = {
    "gpu_p100": "CHI@TACC",
    "gpu_p100_nvlink": "CHI@TACC",
    "gpu_p100_v100": "CHI@TACC",
    "gpu_rtx_6000": "CHI@TACC",
    "compute_liqid": "CHI@TACC",
    "gpu_h100": "CHI@TACC",
    "gpu_v100": "CHI@UC",
    "compute_gigaio": "CHI@UC",
}
GPU_NODE_TYPE_PREFIXES = ("gpu_", "compute_liqid", "compute_gigaio")  # node types with GPUs
# Node types to suggest when the site cannot be asked which it has.
ALTERNATIVES = {"gpu_p100": ("gpu_p100_nvlink", "gpu_rtx_6000")}

DEFAULT_RETRY = {"attempts": 6, "first_delay_s": 2.0, "max_delay_s": 30.0}
TRANSIENT_HTTP = {500, 502, 503, 504}


class ChameleonError(OperationError):
    """Something on Chameleon did not work; the message says what and what to do."""


class CredentialsError(ChameleonError):
    """A credential variable is missing or wrong; the message names it and where to get it."""


class ResourceFailed(ChameleonError):
    """A lease or server went to ERROR (or ended, or vanished: `status` says) while we waited for it."""

    def __init__(self, message: str, status: str):
        super().__init__(message)
        self.status = status


class LeaseNotUsable(ChameleonError):
    """--lease names a lease that provision cannot work on (unknown, ended, another project's, no node, not started)."""


class NoHostsError(ChameleonError):
    """No node of the requested type is free for the requested time."""

    def __init__(self, message: str, next_free: datetime | None = None):
        super().__init__(message)
        self.next_free = next_free


def where_to_get_credentials(site: str) -> str:
    """How to make a credential that every call of ours accepts: leases need a trust (Unrestricted), images a reader."""
    dashboard = DASHBOARDS.get(site, "the dashboard of your site")
    return (
        f"make one in the Chameleon web UI of {site} ({dashboard}): Identity > Application Credentials > "
        "Create Application Credential, tick 'Unrestricted' and give it the roles member and reader, then "
        "download the openrc file it offers and `source` it"
    )


# What each OS_AUTH_TYPE needs besides OS_AUTH_URL and OS_REGION_NAME.
# Alternatives are tuples: one of them must be set.
_NEEDS = {
    "v3applicationcredential": [
        ("OS_APPLICATION_CREDENTIAL_ID", "OS_APPLICATION_CREDENTIAL_NAME"),
        ("OS_APPLICATION_CREDENTIAL_SECRET",),
    ],
    "v3token": [("OS_TOKEN",), ("OS_PROJECT_ID", "OS_PROJECT_NAME")],
    "v3password": [("OS_USERNAME",), ("OS_PASSWORD",), ("OS_PROJECT_ID", "OS_PROJECT_NAME")],
    "v3oidcpassword": [
        ("OS_USERNAME",),
        ("OS_PASSWORD",),
        ("OS_PROJECT_ID", "OS_PROJECT_NAME"),
        ("OS_IDENTITY_PROVIDER",),
        ("OS_PROTOCOL",),
        ("OS_CLIENT_ID",),
        ("OS_DISCOVERY_ENDPOINT",),
    ],
}
# Chameleon's ccauth (`ccauth openrc`) writes this type; its keystoneauth plugin checks its own variables.
CHAMELEON_OIDC = "v3chameleonoidc"
# keystoneauth's short names, which python-chi does not read from the environment (it takes the v3 ones only).
_ALIASES = {"password": "v3password", "token": "v3token", "applicationcredential": "v3applicationcredential"}
# A clouds.yaml entry's fields and the variables an openrc sets for them.
CLOUDS_YAML_VARIABLES = {
    "auth_type": "OS_AUTH_TYPE", "auth.auth_url": "OS_AUTH_URL", "region_name": "OS_REGION_NAME",
    "auth.application_credential_id": "OS_APPLICATION_CREDENTIAL_ID",
    "auth.application_credential_secret": "OS_APPLICATION_CREDENTIAL_SECRET",
}  # fmt: skip


def _plugin_installed(name: str) -> bool:
    """Whether a keystoneauth plugin of that name is installed here (python-chi loads every v3* one)."""
    from importlib.metadata import entry_points

    return any(entry.name == name for entry in entry_points(group="keystoneauth1.plugin"))


def check_credentials(environ: Mapping[str, str], site: str) -> dict:
    """Check the OpenStack variables for `site`; return a summary without secrets.

    Raise CredentialsError naming the first missing or wrong variable. Nothing is
    sent to the cloud here: a wrong secret shows at the first call (see `connect`).
    """
    get = lambda name: (environ.get(name) or "").strip()  # noqa: E731
    where = where_to_get_credentials(site)
    auth_type = get("OS_AUTH_TYPE")
    if get("OS_CLOUD") and not (auth_type or get("OS_AUTH_URL")):
        fields = ", ".join(f"{field} -> {variable}" for field, variable in CLOUDS_YAML_VARIABLES.items())
        raise CredentialsError(
            f"OS_CLOUD={get('OS_CLOUD')} names an entry of a clouds.yaml, which python-chi does not read: "
            f"export its fields as variables instead ({fields}), e.g. with `ccauth openrc` or the openrc file the "
            f"dashboard gives, and unset OS_CLOUD; {where}"
        )
    if auth_type in _ALIASES:
        raise CredentialsError(
            f"OS_AUTH_TYPE={auth_type}: python-chi reads credentials from the environment only under the v3 plugin "
            f"names: set OS_AUTH_TYPE={_ALIASES[auth_type]}; {where}"
        )
    if auth_type == CHAMELEON_OIDC and not _plugin_installed(CHAMELEON_OIDC):
        raise CredentialsError(
            f"OS_AUTH_TYPE={CHAMELEON_OIDC} (written by Chameleon's ccauth) needs ccauth's keystoneauth plugin in this "
            "project's environment, and it is not installed: `.venv/bin/pip install "
            "git+https://github.com/ChameleonCloud/ccauth`, or use an application credential instead; " + where
        )
    if not auth_type:
        if get("OS_APPLICATION_CREDENTIAL_ID") or get("OS_APPLICATION_CREDENTIAL_SECRET"):
            raise CredentialsError(
                "OS_AUTH_TYPE is not set but an application credential is: set OS_AUTH_TYPE=v3applicationcredential "
                f"(the openrc file of an application credential does); {where}"
            )
        if not get("OS_AUTH_URL"):
            raise CredentialsError(
                "no Chameleon credentials in the environment: set OS_AUTH_TYPE=v3applicationcredential, OS_AUTH_URL, "
                f"OS_REGION_NAME, OS_APPLICATION_CREDENTIAL_ID and OS_APPLICATION_CREDENTIAL_SECRET; {where}"
            )
        auth_type = "v3token"  # python-chi's default
    if auth_type not in _NEEDS and auth_type != CHAMELEON_OIDC:
        raise CredentialsError(
            f"OS_AUTH_TYPE={auth_type} is not supported here: use one of {', '.join([*_NEEDS, CHAMELEON_OIDC])}; {where}"
        )
    auth_url = get("OS_AUTH_URL")
    if not auth_url:
        raise CredentialsError(
            f"OS_AUTH_URL is not set (e.g. {DASHBOARDS.get(site, 'https://<site>')}:5000/v3); {where}"
        )
    if not auth_url.startswith(("http://", "https://")) or not auth_url.rstrip("/").endswith("/v3"):
        raise CredentialsError(f"OS_AUTH_URL={auth_url} is not a Keystone v3 URL (https://<site>:5000/v3); {where}")
    region = get("OS_REGION_NAME")
    if not region:
        raise CredentialsError(f"OS_REGION_NAME is not set: set it to the site, e.g. OS_REGION_NAME={site}; {where}")
    if region != site:
        raise CredentialsError(
            f"OS_REGION_NAME={region} but the site to use is {site}: credentials belong to one site; "
            f"use the openrc file of {site}, or choose --site {region}; {where}"
        )
    for alternatives in _NEEDS.get(auth_type, []):  # ccauth's plugin checks its own
        if not any(get(name) for name in alternatives):
            names = " or ".join(alternatives)
            raise CredentialsError(f"{names} is not set (needed with OS_AUTH_TYPE={auth_type}); {where}")
    return {"auth_type": auth_type, "auth_url": auth_url, "region": region}


def node_reservations(node_type: str, count: int, node_names: Sequence[str], properties: Mapping[str, str]) -> list:
    """Blazar's host reservations: `count` nodes of `node_type` with `properties`, or one reservation
    per node name (a name says the type already: python-chi refuses both together, and so do we)."""
    extra = [["==", f"${key}", value] for key, value in properties.items()]

    def reservation(conditions: list, amount: int) -> dict:
        asked = conditions[0] if len(conditions) == 1 else ["and", *conditions]
        return {
            "resource_type": "physical:host",
            "resource_properties": json.dumps(asked),
            "hypervisor_properties": "",
            "min": amount,
            "max": amount,
        }

    if node_names:
        return [reservation([["==", "$node_name", name], *extra], 1) for name in node_names]
    return [reservation([["==", "$node_type", node_type], *extra], count)]


def _resource_properties(text: str | None) -> dict:
    """{"node_type": ..., "node_name": ...} from a reservation's resource_properties, in Blazar's
    syntax: ["==", "$node_type", "gpu_p100"] ("=" too), combined with ["and", A, B, ...]."""
    try:
        properties = json.loads(text or "[]")
    except ValueError:
        return {}
    found: dict = {}

    def walk(expression) -> None:
        if not isinstance(expression, list) or not expression:
            return
        operator, *operands = expression
        if operator == "and":
            for operand in operands:
                walk(operand)
        elif operator in ("==", "=") and len(operands) == 2 and str(operands[0]).startswith("$"):
            found[operands[0][1:]] = operands[1]

    walk(properties)
    return found


def _http_code(error: BaseException) -> int | None:
    """The HTTP status of an error from any of the OpenStack clients, if it has one."""
    kwargs = getattr(error, "kwargs", None)
    if isinstance(kwargs, dict) and isinstance(kwargs.get("code"), int):
        return kwargs["code"]  # blazarclient keeps the real code there
    for attribute in ("http_status", "status_code", "code"):
        value = getattr(error, attribute, None)
        if isinstance(value, int):
            return value
    return None


def _utc(text: str) -> datetime:
    """A Blazar date ('%Y-%m-%dT%H:%M:%S.%f', UTC) as an aware datetime."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=timezone.utc)


def _elapsed(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s"


class ChameleonCloud:
    """One site of Chameleon, through python-chi, with the credentials of the environment."""

    def __init__(
        self,
        site: str,
        poll_interval_s: float = 10,
        progress_every_s: float = 60,
        retry: Mapping | None = None,
        progress: Progress = print,
    ):
        self.site = site
        self.poll_interval_s = poll_interval_s
        self.progress_every_s = progress_every_s
        self.retry = {**DEFAULT_RETRY, **(retry or {})}
        self.progress = progress  # where retries are told
        self.credentials = check_credentials(os.environ, site)
        # Without logging configured, Python prints warnings through its
        # last-resort handler: keep python-chi's deprecation notices, the
        # auth plugins stevedore cannot load (SAML, unused) and the lease
        # errors python-chi logs and swallows off the terminal; we report
        # errors ourselves.
        for name in ("neutronclient.v2_0.client", "chi", "keystoneauth", "openstack", "stevedore.extension"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        try:
            import chi
            import chi.lease
            import chi.network
            import chi.server
        except ImportError as error:
            if "blazarclient" in str(error):
                raise ChameleonError(
                    "python-chi needs blazarclient for leases and does not install it: "
                    "run `.venv/bin/pip install python-blazarclient`"
                ) from None
            raise ChameleonError(f"python-chi is not installed ({error}): run `make` (or pip install -e .)") from None
        self.chi = chi
        chi.context.reset()  # re-read OS_* now: `import chi` read them once, maybe earlier

    # -- plumbing -------------------------------------------------------------

    @staticmethod
    def _transient(error: BaseException, deleting: bool, server_error: bool = True) -> str | None:
        """Why `error` is worth a retry ("answered 503", "lost its connection"), or None.

        server_error: whether a 500 counts (not for Blazar's lease update, whose refusals are 500s)."""
        from keystoneauth1 import exceptions as ksa

        code = _http_code(error)
        if (code in TRANSIENT_HTTP and (server_error or code != 500)) or (deleting and code == 409):
            return f"answered {code}"
        connection_errors = (ksa.ConnectionError, ksa.RetriableConnectionFailure, ConnectionError, TimeoutError)
        if isinstance(error, connection_errors) or type(error).__name__ in ("ConnectionFailed", "ConnectionError"):
            return "lost its connection"
        return None

    def _repeat(self, what: str, deleting: bool, function, *args, **kwargs):
        """function(*args) again after a transient error; the last error is raised as it came."""
        attempts = max(1, int(self.retry["attempts"]))
        delay = float(self.retry["first_delay_s"])
        for attempt in range(1, attempts + 1):
            interrupts.raise_if_requested()
            try:
                return function(*args, **kwargs)
            except Exception as error:
                reason = self._transient(error, deleting)
                if reason is None or attempt == attempts:
                    raise
                self.progress(f"chameleon: {what} {reason}, retrying in {delay:g} s ({attempt}/{attempts - 1})")
                time.sleep(delay)
                delay = min(delay * 2, float(self.retry["max_delay_s"]))

    def _call(self, what: str, function, *args, repeat: str = "", **kwargs):
        """Run one cloud call; turn client errors into ChameleonError with a readable message.

        repeat: "read" or "delete" (a 409 is transient too) for calls that are safe to
        repeat after a transient fault; "" (creates) runs the call once.
        """
        from keystoneauth1 import exceptions as ksa

        interrupts.raise_if_requested()  # a Ctrl-C whose KeyboardInterrupt was lost (provision/interrupts.py)
        try:
            if repeat:
                return self._repeat(what, repeat == "delete", function, *args, **kwargs)
            return function(*args, **kwargs)
        except ChameleonError:
            raise
        except ksa.ConnectFailure as error:
            raise ChameleonError(
                f"{what}: cannot reach the cloud ({error}); check OS_AUTH_URL and your network"
            ) from None
        except Exception as error:
            code = _http_code(error)
            if code == 401 or isinstance(error, ksa.Unauthorized):
                raise CredentialsError(
                    f"{what}: the cloud refused the credentials (OS_APPLICATION_CREDENTIAL_ID/SECRET or token expired, "
                    f"deleted or for another site?); {where_to_get_credentials(self.site)}"
                ) from None
            if code == 403 or isinstance(error, ksa.Forbidden):
                raise CredentialsError(
                    f"{what}: the cloud answered 403 Forbidden ({error}). A credential with the member role alone "
                    f"may not read images or servers: {where_to_get_credentials(self.site)}"
                ) from None
            if isinstance(error, ksa.EndpointNotFound):
                raise ChameleonError(
                    f"{what}: {self.site} offers no such service ({error}); check OS_REGION_NAME"
                ) from None
            raise ChameleonError(f"{what}: {error}") from error

    def _wait(
        self,
        what: str,
        fetch,
        ready: Callable[[str], bool],
        failed: Callable[[str], bool],
        timeout_s: float,
        progress: Progress,
    ):
        """Poll `fetch()` -> (status, details) until ready; report status changes and elapsed time."""
        start = time.monotonic()
        last_status, last_report = None, start
        while True:
            status, details = fetch()
            interrupts.raise_if_requested()
            elapsed = time.monotonic() - start
            if status != last_status:
                progress(f"{what}: {status} ({_elapsed(elapsed)} elapsed)")
                last_status, last_report = status, time.monotonic()
            elif time.monotonic() - last_report >= self.progress_every_s:
                progress(f"{what}: still {status} ({_elapsed(elapsed)} elapsed)")
                last_report = time.monotonic()
            if ready(status):
                return details
            if failed(status):
                raise ResourceFailed(
                    f"{what} went to {status}" + (f": {details}" if isinstance(details, str) and details else ""),
                    status,
                )
            if elapsed >= timeout_s:
                raise ChameleonError(
                    f"{what} is still {status} after {_elapsed(elapsed)} (timeout {_elapsed(timeout_s)})"
                )
            time.sleep(self.poll_interval_s)

    # -- identity -------------------------------------------------------------

    def user_name(self) -> str:
        """The Keystone user name behind the credentials (authenticates: wrong ones fail here)."""
        session = self._call("authenticating", self.chi.session)
        inner = getattr(session, "session", session)
        access = self._call("authenticating", inner.auth.get_access, inner)
        return access.username or access.user_id

    # -- key pairs ------------------------------------------------------------

    def ensure_keypair(self, name: str, public_key: str) -> bool:
        """Make sure key pair `name` holds `public_key`; True if it was uploaded now.

        A pair of that name with another key is an error, never replaced: it may
        be the key of the user's other work.
        """
        from novaclient.exceptions import NotFound

        nova = self.chi.nova()
        try:
            existing = self._repeat(f"looking up key pair {name}", False, nova.keypairs.get, name)
        except NotFound:
            self._call(f"uploading key pair {name}", nova.keypairs.create, name, public_key=public_key, key_type="ssh")
            return True
        except Exception as error:
            self._call(f"looking up key pair {name}", _raise, error)
        wanted = self.chi.util.sshkey_fingerprint(public_key)
        if existing.fingerprint != wanted:
            raise ChameleonError(
                f"key pair {name} on {self.site} holds another public key (fingerprint {existing.fingerprint}, yours "
                f"{wanted}): choose another key pair name (--key-name) or delete that pair (web UI > Compute > Key Pairs)"
            )
        return False

    def keypair_exists(self, name: str) -> bool:
        return any(
            k.name == name for k in self._call("listing key pairs", self.chi.nova().keypairs.list, repeat="read")
        )

    # -- leases ---------------------------------------------------------------

    @staticmethod
    def _lease_view(body: dict) -> dict:
        reservations = body.get("reservations") or []
        node = [r for r in reservations if r.get("resource_type") == "physical:host"]
        fip = [r for r in reservations if r.get("resource_type") == "virtual:floatingip"]
        asked = _resource_properties(node[0].get("resource_properties")) if node else {}
        return {
            "id": body["id"],
            "name": body["name"],
            "status": body["status"],
            "start": _utc(body["start_date"]).isoformat(),
            "end": _utc(body["end_date"]).isoformat(),
            "status_reason": body.get("status_reason") or "",
            "node_reservation_id": node[0]["id"] if node else None,
            # One per node a lease asks for by name (--node); the servers go on them in turn.
            "node_reservation_ids": [r["id"] for r in node],
            "fip_reservation_id": fip[0]["id"] if fip else None,
            # What the node reservation asks for (a lease made in the dashboard says it here only).
            "node_type": asked.get("node_type"),
            "node_count": sum(int(r.get("max") or r.get("min") or 1) for r in node),
            "reservation_kinds": sorted({r.get("resource_type", "?") for r in reservations}),
        }

    def lease_by_reference(self, reference: str) -> dict | None:
        """The project's lease whose id or name is `reference` (made here, in the dashboard or the
        CLI), live ones first; None if the project has none. Another project's gets a ChameleonError."""
        from blazarclient.exception import BlazarClientException

        leases = self._call("listing leases", self.chi.blazar().lease.list, repeat="read")
        by_id = [lease for lease in leases if lease["id"] == reference]
        named = sorted(
            (lease for lease in leases if lease["name"] == reference),
            key=lambda lease: (lease["status"] not in LEASE_ENDING | {LEASE_FAILED}, lease["start_date"]),
        )
        live = [lease for lease in named if lease["status"] not in LEASE_ENDING | {LEASE_FAILED}]
        if len(live) > 1:
            raise ChameleonError(
                f"{len(live)} live leases are called {reference}: give the id of the one to use (--lease ID; "
                f"ids: {', '.join(lease['id'] for lease in live)})"
            )
        if by_id or named:
            return self._lease_view((by_id or named)[-1])
        # Not in the project's list: a lease of another project answers 403 to its id.
        try:
            self.chi.blazar().lease.get(reference)
        except BlazarClientException as error:
            if _http_code(error) == 403:
                raise LeaseNotUsable(
                    f"lease {reference} at {self.site} belongs to another project (Blazar: "
                    f"{str(error).removeprefix('ERROR: ')}): use a lease of your credentials' project "
                    f"({os.environ.get('OS_PROJECT_NAME') or os.environ.get('OS_PROJECT_ID') or 'OS_PROJECT_NAME'}), "
                    "or source the openrc of the lease's project"
                ) from None
        except Exception:  # noqa: BLE001 - a name is no id: whatever the GET says, the project has no such lease
            pass
        return None

    def lease_names(self) -> list[str]:
        """'name (STATUS)' of each lease the project has at this site, for messages."""
        leases = self._call("listing leases", self.chi.blazar().lease.list, repeat="read")
        return [f"{lease['name']} ({lease['status']})" for lease in leases]

    def find_lease(self, name: str) -> dict | None:
        """Our live (not ending) lease called `name`, if any: finds a lease whose id was never saved."""
        leases = self._call("listing leases", self.chi.blazar().lease.list, repeat="read")
        live = [lease for lease in leases if lease["name"] == name and lease["status"] not in LEASE_ENDING]
        if len(live) > 1:
            raise ChameleonError(
                f"{len(live)} leases are called {name}: delete the extra ones in the web UI (Reservations > Leases)"
            )
        return self._lease_view(live[0]) if live else None

    def create_lease(
        self,
        name: str,
        node_type: str,
        count: int,
        hours: float,
        reserve_floating_ip: bool = True,
        node_names: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        start: datetime | None = None,
    ) -> dict:
        """Reserve `count` nodes of `node_type` (and a floating IP per node) from now for `hours`:
        any nodes of the type with `properties` ({key: value}, Blazar's $key == value), or the nodes
        called `node_names`, one each (then count is their number). From `start` (aware), a slot
        booked ahead: the lease stays PENDING until then.

        Raise NoHostsError (with the next free slot when Blazar can tell) if no node is free.
        """
        from blazarclient.exception import BlazarClientException

        if node_names:
            self.check_node_names(node_names)
        if start is None:
            lease = self.chi.lease.Lease(name, duration=timedelta(hours=hours))
        else:  # python-chi adds a duration to now, whatever the start: the end is given
            begin = start.astimezone(timezone.utc).replace(tzinfo=None)
            lease = self.chi.lease.Lease(name, start_date=begin, end_date=begin + timedelta(hours=hours))
        if reserve_floating_ip:
            self._call("preparing the lease", lease.add_fip_reservation, amount=count)
        reservations = node_reservations(node_type, count, node_names, properties or {}) + lease.fip_reservations
        try:
            body = self.chi.blazar().lease.create(
                name=name, start=lease.start_date, end=lease.end_date, reservations=reservations, events=[]
            )
        except BlazarClientException as error:
            message = str(error).removeprefix("ERROR: ")
            code = _http_code(error)
            # Blazar answers both shortages with a 500 and the same words: the pool tells them apart.
            if "not enough floating ip" in message.lower():
                raise ChameleonError(
                    f"no floating IP is free to reserve with the lease at {self.site} ({message}). The nodes are "
                    "not the problem: reserved addresses come from a pool of their own. Reserve none and take an "
                    "ad-hoc address instead: `fab provision --target chameleon --floating-ip adhoc` "
                    "(or lab.chameleon.floating_ip: adhoc)"
                ) from None
            if "not enough" in message.lower() and "available" in message.lower():
                raise self.no_hosts(node_type, count, hours, message) from None
            if code == 401:
                self._call("creating the lease", _raise, error)
            if code in (403, 500):
                raise CredentialsError(
                    f"creating lease {name} on {self.site} failed (HTTP {code}: {message}). On Chameleon this is "
                    f"most often an application credential made without 'Unrestricted', which may not create "
                    f"the Keystone trust Blazar makes for every lease: {where_to_get_credentials(self.site)}"
                ) from None
            raise ChameleonError(f"creating lease {name} on {self.site} failed: {message}") from None
        except Exception as error:
            self._call("creating the lease", _raise, error)
        return self._lease_view(body)

    def hosts(self) -> list[dict]:
        """The site's reservable hosts as Blazar lists them (node_type, node_name and the other properties)."""
        return self._call("listing hosts", self.chi.blazar().host.list, repeat="read")

    def check_node_names(self, names: Sequence[str]) -> None:
        """ChameleonError naming the similar ones, for a node name the site does not have."""
        known = sorted({host.get("node_name") for host in self.hosts() if host.get("node_name")})
        for name in names:
            if name not in known:
                similar = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
                hint = f"similar names: {', '.join(similar)}" if similar else f"its nodes: {', '.join(known[:10])}"
                raise ChameleonError(
                    f"no node {name} at {self.site} ({hint}). Node names are in the dashboard's Host Calendar "
                    "(Reservations > Leases > Host Calendar) and in the hardware browser"
                )

    def no_hosts(self, node_type: str, count: int, hours: float, reason: str) -> NoHostsError:
        """The error for "no node free", with what the user can do at this site, or where the type is."""
        next_free, here = None, []
        try:
            here = self.hosts()
            next_free = self.next_free_slot(node_type, count, hours)
        except ChameleonError:
            pass  # the advice below stands without them
        types_here = sorted({h.get("node_type") for h in here if h.get("node_type")})
        if here and node_type not in types_here:  # the type is not at this site at all
            elsewhere = NODE_TYPE_SITES.get(node_type)
            go = (
                f"it is at {elsewhere}: --site {elsewhere} with that site's credentials (an openrc of its own)"
                if elsewhere
                else "choose one of the site's own types (--node-type)"
            )
            return NoHostsError(
                f"{self.site} has no {node_type} node ({reason}); its node types: {', '.join(types_here)}. {go}."
            )
        when = (
            f" Blazar's calendar shows the next free slot for {count} x {node_type} for {hours:g} h at "
            f"{next_free:%Y-%m-%d %H:%M} UTC."
            if next_free
            else ""
        )
        instead = [t for t in types_here if t != node_type and t.startswith(GPU_NODE_TYPE_PREFIXES)]
        instead = instead or [t for t in ALTERNATIVES.get(node_type, ()) if not here]  # unknown: what we know
        other_types = f" another node type here (--node-type {' or '.join(instead)})," if instead else ""
        return NoHostsError(
            f"no {node_type} node is free at {self.site} for {hours:g} h ({reason}).{when} What you can do: try later "
            f"or a shorter lease (--hours),{other_types} or book a slot ahead in the dashboard and work in it "
            f"(fab provision --lease NAME); the calendar is in the web UI under Reservations > Leases > Host Calendar.",
            next_free,
        )

    def next_free_slot(self, node_type: str, count: int, hours: float) -> datetime | None:
        """When `count` hosts of `node_type` are next free together for `hours`, per Blazar's allocations."""
        blazar = self.chi.blazar()
        hosts = [h for h in self.hosts() if h.get("node_type") == node_type]
        if len(hosts) < count:
            return None
        allocations = {
            a["resource_id"]: a["reservations"]
            for a in self._call("listing allocations", blazar.allocation.list, "os-hosts", repeat="read")
        }
        now = datetime.now(timezone.utc)
        length = timedelta(hours=hours)
        starts = []
        for host in hosts:
            busy = sorted((_utc(r["start_date"]), _utc(r["end_date"])) for r in allocations.get(host["id"], []))
            start = now
            for busy_start, busy_end in busy:
                if busy_end <= start:
                    continue
                if start + length <= busy_start:
                    break
                start = busy_end
            starts.append(start)
        # Approximate for count > 1: the count-th earliest host start (gaps of different hosts may not overlap).
        return sorted(starts)[count - 1]

    def lease(self, lease_id: str) -> dict | None:
        """The lease, or None if the cloud no longer has it."""
        from blazarclient.exception import BlazarClientException

        try:
            body = self._repeat(f"reading lease {lease_id}", False, self.chi.blazar().lease.get, lease_id)
        except BlazarClientException as error:
            if _http_code(error) == 404:
                return None
            return self._call(f"reading lease {lease_id}", _raise, error)
        except Exception as error:
            return self._call(f"reading lease {lease_id}", _raise, error)
        return self._lease_view(body)

    def wait_lease_active(self, lease_id: str, timeout_s: float, progress: Progress, label: str = "") -> dict:
        """Wait until the lease is ACTIVE; raise ChameleonError if it goes to ERROR, ends or vanishes."""

        def fetch():
            lease = self.lease(lease_id)
            if lease is None:
                return "GONE", None
            # On ERROR the details are Blazar's reason, which the failure message carries.
            return lease["status"], (lease if lease["status"] != LEASE_FAILED else lease["status_reason"])

        return self._wait(
            f"lease {label or lease_id}",
            fetch,
            lambda s: s == "ACTIVE",
            lambda s: s in LEASE_ENDING | {LEASE_FAILED, "GONE"},
            timeout_s,
            progress,
        )

    def extend_lease(self, lease_id: str, hours: float) -> dict:
        """Move the lease's end `hours` later (Chameleon allows it within 48 h of the end, if the node is free).

        The new end is computed once, from the lease as the cloud has it, and sent as an
        absolute end_date: blazarclient's prolong_for adds to whatever end it reads, so a
        retry after a lost answer would extend twice. Only what is transient is retried
        (502/503/504, a lost connection), each retry after reading the lease again: an
        update that went through is not sent twice. A 500 is Blazar's answer to a refusal.
        """
        from blazarclient.exception import BlazarClientException

        current = self.lease(lease_id)
        if current is None:
            raise ChameleonError(f"lease {lease_id} no longer exists on {self.site}: nothing to extend")
        end = datetime.fromisoformat(current["end"]) + timedelta(minutes=max(1, round(hours * 60)))
        end_date = end.strftime(BLAZAR_DATE)  # minutes: Blazar's API keeps no more
        attempts, delay = max(1, int(self.retry["attempts"])), float(self.retry["first_delay_s"])
        for attempt in range(1, attempts + 1):
            interrupts.raise_if_requested()
            try:
                return self._lease_view(self.chi.blazar().lease.update(lease_id, end_date=end_date))
            except BlazarClientException as error:
                reason = self._transient(error, deleting=False, server_error=False)
                if reason is None or attempt == attempts:
                    if _http_code(error) == 401:
                        self._call("extending the lease", _raise, error)
                    message = str(error).removeprefix("ERROR: ")
                    raise ChameleonError(
                        f"{self.site} refused to extend lease {lease_id} by {hours:g} h (to {end_date} UTC): {message}. "
                        "A lease can be extended only within 48 h of its end and if no one reserved the node after "
                        "it; try fewer hours, or make a new lease after this one ends"
                    ) from None
            except Exception as error:
                reason = self._transient(error, deleting=False, server_error=False)
                if reason is None or attempt == attempts:
                    self._call("extending the lease", _raise, error)
            self.progress(f"chameleon: extending the lease {reason}, retrying in {delay:g} s ({attempt}/{attempts - 1})")
            time.sleep(delay)
            delay = min(delay * 2, float(self.retry["max_delay_s"]))
            again = self.lease(lease_id)
            if again is not None and datetime.fromisoformat(again["end"]).strftime(BLAZAR_DATE) == end_date:
                return again  # the lost answer's update went through: not sent twice
        raise AssertionError("unreachable")

    def delete_lease(self, lease_id: str) -> None:
        """Delete the lease (Blazar then frees its node and its reserved floating IPs). Already gone is fine."""
        from blazarclient.exception import BlazarClientException

        try:
            self._repeat(f"deleting lease {lease_id}", True, self.chi.blazar().lease.delete, lease_id)
        except BlazarClientException as error:
            if _http_code(error) != 404:
                self._call(f"deleting lease {lease_id}", _raise, error)
        except Exception as error:
            self._call(f"deleting lease {lease_id}", _raise, error)

    def lease_exists(self, lease_id: str) -> bool:
        return self.lease(lease_id) is not None

    def reserved_floating_ips(self, fip_reservation_id: str) -> list[dict]:
        """The floating IPs Blazar created for a floating-IP reservation (tagged reservation:<id>)."""
        fips = self._call("listing floating IPs", self.chi.network.list_floating_ips, repeat="read")
        tag = f"reservation:{fip_reservation_id}"
        return [{"id": f["id"], "address": f["floating_ip_address"]} for f in fips if tag in (f.get("tags") or [])]

    # -- servers ----------------------------------------------------------------

    @staticmethod
    def _server_view(server) -> dict:
        fixed, floating = [], []
        for addresses in (server.addresses or {}).values():
            for address in addresses:
                (floating if address.get("OS-EXT-IPS:type") == "floating" else fixed).append(address["addr"])
        fault = getattr(server, "fault", None) or {}
        return {
            "id": server.id,
            "name": server.name,
            "status": server.status,
            "fixed_ips": fixed,
            "floating_ips": floating,
            "fault": fault.get("message", "") if isinstance(fault, dict) else str(fault),
        }

    def find_server(self, name: str) -> dict | None:
        """Our server called `name`, if any (finds a server whose id was never saved)."""
        servers = [
            s for s in self._call("listing servers", self.chi.nova().servers.list, repeat="read") if s.name == name
        ]
        if len(servers) > 1:
            raise ChameleonError(
                f"{len(servers)} servers are called {name}: delete the extra ones in the web UI (Compute > Instances)"
            )
        return self._server_view(servers[0]) if servers else None

    def create_server(
        self, name: str, reservation_id: str, image: str, flavor: str, key_name: str, network: str
    ) -> dict:
        """Launch a bare-metal server on the node reservation; returns it (BUILD) once Nova has it."""
        server = self._call(
            f"preparing server {name} (image {image}, flavor {flavor}, network {network})",
            self.chi.server.Server,
            name,
            reservation_id=reservation_id,
            image_name=image,
            flavor_name=flavor,
            key_name=key_name,
            network_name=network,
        )
        # show=None: the default "widget" raises outside Jupyter after the server exists.
        self._call(f"creating server {name}", server.submit, wait_for_active=False, show=None, idempotent=True)
        created = self.find_server(name)
        if created is None:
            raise ChameleonError(
                f"Nova accepted server {name} but does not list it: check Compute > Instances in the web UI"
            )
        return created

    def server(self, server_id: str) -> dict | None:
        """The server, or None if Nova no longer has it."""
        from novaclient.exceptions import NotFound

        try:
            return self._server_view(
                self._repeat(f"reading server {server_id}", False, self.chi.nova().servers.get, server_id)
            )
        except NotFound:
            return None
        except Exception as error:
            return self._call(f"reading server {server_id}", _raise, error)

    def wait_server_active(self, server_id: str, timeout_s: float, progress: Progress, label: str = "") -> dict:
        """Wait until the server is ACTIVE (bare metal: 10-20 min); raise with Nova's fault on ERROR."""

        def fetch():
            server = self.server(server_id)
            if server is None:
                return "GONE", None
            return server["status"], (server if server["status"] != "ERROR" else server["fault"])

        return self._wait(
            f"server {label or server_id}",
            fetch,
            lambda s: s == "ACTIVE",
            lambda s: s in ("ERROR", "GONE", "DELETED"),
            timeout_s,
            progress,
        )

    def delete_server(self, server_id: str) -> None:
        """Delete the server, leaving its floating IPs to us (delete_ips=True leaks them). Gone is fine."""
        from novaclient.exceptions import NotFound

        try:
            self._repeat(f"deleting server {server_id}", True, self.chi.server.delete_server, server_id)
        except NotFound:
            pass
        except Exception as error:
            self._call(f"deleting server {server_id}", _raise, error)

    def server_exists(self, server_id: str) -> bool:
        return self.server(server_id) is not None

    # -- floating IPs -------------------------------------------------------------

    def floating_ip(self, address: str) -> dict | None:
        for fip in self._call("listing floating IPs", self.chi.network.list_floating_ips, repeat="read"):
            if fip["floating_ip_address"] == address:
                return {
                    "id": fip["id"],
                    "address": address,
                    "port_id": fip.get("port_id"),
                    "tags": fip.get("tags") or [],
                }
        return None

    def allocate_floating_ip(self, description: str) -> dict:
        """A new floating IP from the public network, labelled `description` (to find it if its id is lost)."""
        neutron = self.chi.neutron()
        network_id = self._call(
            "looking up the public network",
            self.chi.network.get_network_id,
            self.chi.network.PUBLIC_NETWORK,
            repeat="read",
        )
        body = {"floatingip": {"floating_network_id": network_id, "description": description}}
        fip = self._call("allocating a floating IP", neutron.create_floatingip, body)["floatingip"]
        return {"id": fip["id"], "address": fip["floating_ip_address"]}

    def floating_ips_described(self, description: str) -> list[dict]:
        """Ad-hoc floating IPs we allocated with this description."""
        fips = self._call("listing floating IPs", self.chi.network.list_floating_ips, repeat="read")
        return [
            {"id": f["id"], "address": f["floating_ip_address"]} for f in fips if f.get("description") == description
        ]

    def associate_floating_ip(self, server_id: str, address: str) -> None:
        """Attach the floating IP to the server's port (python-chi's own helper hides Neutron's errors)."""
        ports = self._call(
            "listing the server's ports", self.chi.neutron().list_ports, device_id=server_id, repeat="read"
        )["ports"]
        ports = [p for p in ports if p.get("fixed_ips")]
        if not ports:
            raise ChameleonError(f"server {server_id} has no port with an address yet: run provision again in a minute")
        self._call(
            f"attaching floating IP {address}", self.chi.network.bind_floating_ip, address, port_id=ports[0]["id"]
        )

    def deallocate_floating_ip(self, address: str) -> None:
        """Release an ad-hoc floating IP. A lease-reserved one is refused: it goes with its lease."""
        fip = self.floating_ip(address)
        if fip is None:
            return
        if any(tag.startswith("reservation:") for tag in fip["tags"]):
            raise ChameleonError(f"floating IP {address} belongs to a lease reservation: it is released with the lease")
        self._call(
            f"releasing floating IP {address}", self.chi.network.deallocate_floating_ip, address, repeat="delete"
        )

    # -- SSH ------------------------------------------------------------------------

    def wait_for_ssh(self, address: str, port: int, timeout_s: float, progress: Progress) -> str:
        """Wait until `address:port` answers with an SSH banner; return the banner."""
        start = time.monotonic()
        last_report = start
        progress(f"waiting for SSH on {address}:{port} (the node boots after it turns ACTIVE)")
        while True:
            # Each attempt may take what is left of the wait (a slow sshd greets late), at most one progress period.
            remaining = timeout_s - (time.monotonic() - start)
            banner = ssh_banner(address, port, timeout_s=max(0.5, min(remaining, self.progress_every_s)))
            if banner:
                return banner
            elapsed = time.monotonic() - start
            if elapsed >= timeout_s:
                raise ChameleonError(
                    f"{address}:{port} did not answer SSH within {_elapsed(timeout_s)}: the node may still be booting "
                    "(run provision again to wait more) or failed to boot (see its console in the web UI, Compute > "
                    "Instances); `fab teardown` releases it"
                )
            if time.monotonic() - last_report >= self.progress_every_s:
                progress(f"still waiting for SSH on {address}:{port} ({_elapsed(elapsed)} elapsed)")
                last_report = time.monotonic()
            time.sleep(self.poll_interval_s)


def ssh_banner(address: str, port: int, timeout_s: float = 5) -> str | None:
    """The server's SSH banner ('SSH-2.0-...'), or None if nothing SSH answers there."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s) as connection:
            connection.settimeout(timeout_s)
            data = connection.recv(256)
    except OSError:
        return None
    line = data.split(b"\r\n")[0].split(b"\n")[0].decode("ascii", "replace")
    return line if line.startswith("SSH-") else None


def _raise(error: BaseException):
    """Re-raise inside ChameleonCloud._call, so it is translated like any other client error."""
    raise error

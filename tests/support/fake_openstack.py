"""A fake Chameleon site (OpenStack REST APIs) on 127.0.0.1, for driving the real python-chi.

One threaded HTTP server answers Keystone v3 (tokens with a service catalog),
Blazar (leases, hosts, allocations), Nova (servers, key pairs, flavors),
Neutron (networks, floating IPs, ports) and Glance (images), each under its
own path prefix, in the shapes python-chi 1.2.10 and the clients under it
(keystoneauth1, blazarclient, novaclient, neutronclient, glanceclient,
openstacksdk) send and expect. Every resource it holds is recorded, so tests
can assert exactly what exists (`held()`), and `fail` injects failures:

    fake.fail["lease_create"] = "no_hosts"      # POST /leases -> 500 "Not enough hosts available"
    fake.fail["lease_create"] = "no_fips"       # POST /leases -> 500 "Not enough floating IPs available"
    fake.fail["lease_create"] = "restricted_credential"  # POST /leases -> 500 (Blazar cannot make its trust)
    fake.fail["member_only"] = True             # GET /v2/images and POST /servers -> 403 (no `reader` role)
    fake.fail["lease_status"] = "ERROR"         # the lease goes to ERROR instead of ACTIVE
    fake.fail["server_status"] = "ERROR"        # the server goes to ERROR instead of ACTIVE
    fake.fail["fip_associate"] = True           # PUT /floatingips/{id} answers 500
    fake.fail["server_delete"] = True           # DELETE /servers/{id} answers 500
    fake.fail["lease_delete"] = True            # DELETE /leases/{id} answers 500
    fake.fail["fip_delete"] = True              # DELETE /floatingips/{id} answers 500
    fake.fail["lease_extend"] = True            # PUT /leases/{id} -> 500 "Not enough hosts available"

and `fault()` injects transient ones, each answered once (or `times`) before
the request is served as usual:

    fake.fault("DELETE", r"/compute/.*/servers/[^/]+", 500)     # one 500, then the delete works
    fake.fault("GET", r"/reservation/.*/leases/[^/]+", 503, times=2)
    fake.fault("POST", r"/reservation/.*/leases", "lost")     # the lease is made, the answer is a 504
    fake.fault("GET", r"/network/.*/floatingips", "drop")      # the connection closes without an answer

States move on as the client polls: a lease is PENDING for `lease_polls_to_active`
GETs, a server BUILD for `server_polls_to_active`; with the defaults both answer
their terminal state at once, so python-chi's 5 s wait loops never sleep. A lease
booked ahead stays PENDING until its start, then is STARTING for a poll, then
ACTIVE; `advance(hours)` moves the fake's clock there without waiting.
`book_lease()` makes a lease as the dashboard does (of this project or another).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import itertools
import json
import re
import socket
import threading
import uuid
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

REGION = "CHI@TACC"
USER_NAME = "alice"
USER_ID = "u" + "1" * 31
PROJECT_ID = "p" + "2" * 31
PROJECT_NAME = "CHI-000000"
APP_CRED_ID = "appcred-id-for-tests"
APP_CRED_SECRET = "appcred-secret-for-tests"

LEASE_FORMAT = "%Y-%m-%dT%H:%M:%S.%f"  # what Blazar answers
CREATED_FORMAT = "%Y-%m-%d %H:%M:%S"


_clock_shift = timedelta(0)  # FakeOpenStack.advance(): the fake's time runs ahead of the real one


def _now() -> datetime:
    """The fake's time (naive UTC, as Blazar keeps it)."""
    return datetime.now(timezone.utc).replace(tzinfo=None) + _clock_shift


def _parse_api_date(text: str) -> datetime:
    """Blazar accepts "now" or "%Y-%m-%d %H:%M" (what blazarclient and python-chi send)."""
    if text == "now":
        return _now()
    return datetime.strptime(text, "%Y-%m-%d %H:%M")


def fingerprint(public_key: str) -> str:
    """Nova's MD5 fingerprint of an OpenSSH public key (aa:bb:...)."""
    digest = hashlib.md5(base64.b64decode(public_key.split()[1])).hexdigest()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


class HTTPError(Exception):
    def __init__(self, code: int, body: dict | None = None):
        super().__init__(code)
        self.code = code
        self.body = body


def _matches(host: dict, properties: list) -> bool:
    """Whether a host has what a reservation's resource_properties ask, in Blazar's syntax:
    [] (any host), ["==", "$node_type", "gpu_p100"] ("=" as well), ["and", A, B, ...]."""
    if not properties:
        return True
    operator, *operands = properties
    if operator == "and":
        return all(_matches(host, operand) for operand in operands)
    if operator in ("==", "=") and len(operands) == 2 and str(operands[0]).startswith("$"):
        return str(host.get(operands[0][1:])) == str(operands[1])
    raise HTTPError(400, {"error_code": 400, "error_message": f"Malformed resource property: {properties}"})


def _blazar_error(name: str, message: str) -> HTTPError:
    """Blazar's answer for one of its exceptions. Those without a code of their own (NotEnoughHostsAvailable,
    NotEnoughFloatingIPAvailable, BlazarException) are 500s: BlazarException's default code."""
    return HTTPError(500, {"error_code": 500, "error_name": name, "error_message": message})


class FakeOpenStack:
    """The fake site. `start()`, then point python-chi at it with `env()`."""

    def __init__(self, node_types: dict[str, int] | None = None, floating_ips: list[str] | None = None):
        # Reservable bare-metal hosts per node type: one P100 node by default.
        self.node_types = node_types if node_types is not None else {"gpu_p100": 1}
        # Addresses handed out as floating IPs. Loopback addresses, so that a
        # test can listen on them and make the "node" reachable by SSH.
        self.address_pool = list(floating_ips or [f"127.0.0.{i}" for i in range(10, 60)])
        self.fail: dict = {}
        self.faults: list[dict] = []  # transient faults, see fault()
        self.lease_polls_to_active = 0
        self.server_polls_to_active = 0
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self.lock = threading.RLock()
        self.leases: dict[str, dict] = {}
        self.servers: dict[str, dict] = {}
        self.floatingips: dict[str, dict] = {}
        self.ports: dict[str, dict] = {}
        self.keypairs: dict[str, dict] = {}
        # Other users' reservations: (host id, start, end) that block a host.
        self.foreign_allocations: list[tuple[str, datetime, datetime]] = []
        self._poll_counts: dict[str, int] = {}
        self._fixed = itertools.count(10)
        self.networks = {
            "net-sharednet1": {"id": "net-sharednet1", "name": "sharednet1", "router:external": False},
            "net-public": {"id": "net-public", "name": "public", "router:external": True},
        }
        for network in self.networks.values():
            network.update(status="ACTIVE", subnets=[], shared=True, tags=[], project_id=PROJECT_ID, description="")
        self.images = {
            "img-cuda": {"id": "img-cuda", "name": "CC-Ubuntu24.04-CUDA"},
            "img-plain": {"id": "img-plain", "name": "CC-Ubuntu24.04"},
        }
        for image in self.images.values():
            image.update(
                status="active",
                visibility="public",
                tags=[],
                container_format="bare",
                disk_format="qcow2",
                created_at="2025-01-01T00:00:00Z",
            )
        self.images["img-cuda"]["build-repo"] = "https://github.com/ChameleonCloud/cc-images"
        self.flavors = {"flv-bm": {"id": "flv-bm", "name": "baremetal"}}
        # Chameleon's hosts carry their node type and a name of their own (node_name), which a
        # reservation can ask for: the course books its P100 node by name.
        self.hosts = [
            {
                "id": f"host-{node_type}-{i}",
                "hypervisor_hostname": f"{node_type}-{i}",
                "node_type": node_type,
                "node_name": f"{node_type.upper().replace('_', '-')}-{i + 1:03d}",
            }
            for node_type, count in self.node_types.items()
            for i in range(count)
        ]
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle -------------------------------------------------------

    def start(self) -> FakeOpenStack:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet: pytest shows failures, not access logs
                pass

            def _handle(self):
                fake._dispatch(self)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-openstack", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        global _clock_shift
        _clock_shift = timedelta(0)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def env(self) -> dict[str, str]:
        """The variables a Chameleon application-credential RC file sets, pointing at this fake."""
        return {
            "OS_AUTH_TYPE": "v3applicationcredential",
            "OS_AUTH_URL": f"{self.url}/identity/v3",
            "OS_IDENTITY_API_VERSION": "3",
            "OS_REGION_NAME": REGION,
            "OS_INTERFACE": "public",
            "OS_APPLICATION_CREDENTIAL_ID": APP_CRED_ID,
            "OS_APPLICATION_CREDENTIAL_SECRET": APP_CRED_SECRET,
            "CHI_RESOURCE_API_URL": self.url,
        }

    # -- what the tests look at -------------------------------------------

    def held(self) -> dict[str, int]:
        """How many leases, servers and floating IPs the project holds now."""
        with self.lock:
            return {
                "leases": len(self.leases),
                "servers": len(self.servers),
                "floatingips": len(self.floatingips),
            }

    def fault(self, method: str, path: str, kind: int | str, times: int = 1, skip: int = 0) -> None:
        """Answer `times` requests `method` `path` (a regex on the whole path), after `skip` served ones, with `kind`.

        kind: an HTTP status (the request is not served), "lost" (served, then
        answered 504 as a gateway that lost the answer) or "drop" (not served,
        the connection closed without an answer).
        """
        with self.lock:
            self.faults.append({"method": method, "path": re.compile(path), "kind": kind, "left": times, "skip": skip})

    def _take_fault(self, method: str, path: str):
        with self.lock:
            for fault in self.faults:
                if fault["left"] > 0 and fault["method"] == method and fault["path"].fullmatch(path):
                    if fault["skip"] > 0:
                        fault["skip"] -= 1
                        continue
                    fault["left"] -= 1
                    return fault["kind"]
        return None

    def advance(self, hours: float) -> None:
        """Move the fake's clock `hours` ahead (it never goes back): a lease booked for then starts,
        without the test waiting for it."""
        global _clock_shift
        _clock_shift += timedelta(hours=hours)

    def block_hosts(self, node_type: str, hours: float) -> datetime:
        """Another user reserves every host of `node_type` from now for `hours`; returns the end."""
        end = _now() + timedelta(hours=hours)
        for host in self.hosts:
            if host["node_type"] == node_type:
                self.foreign_allocations.append((host["id"], _now() - timedelta(minutes=5), end))
        return end

    # -- HTTP plumbing ------------------------------------------------------

    def _dispatch(self, handler: BaseHTTPRequestHandler) -> None:
        parsed = urlparse(handler.path)
        path = parsed.path.rstrip("/") or "/"
        query = {key: values[-1] for key, values in parse_qs(parsed.query).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        method = handler.command
        with self.lock:
            self.requests.append((method, path))
        headers: dict[str, str] = {}
        fault = self._take_fault(method, path)
        if fault == "drop":
            handler.close_connection = True
            handler.connection.shutdown(2)  # socket.SHUT_RDWR: the client sees the connection reset
            return
        try:
            if isinstance(fault, int):
                raise HTTPError(fault, {"error": {"code": fault, "message": f"injected: transient {fault}"}})
            if path != "/identity/v3/auth/tokens" and not path.endswith(("/identity/v3", "/identity")):
                self._check_token(handler, path)
            code, payload = self._route(method, path, query, body, headers)
            if fault == "lost":
                code, payload = 504, {"error": {"code": 504, "message": "injected: Gateway Timeout"}}
        except HTTPError as error:
            code, payload = error.code, error.body
        except Exception as error:  # a bug in the fake: say so loudly in the answer
            code, payload = 500, {"error": f"fake_openstack crashed: {error!r}"}
        data = b"" if payload is None else json.dumps(payload).encode()
        handler.send_response(code)
        for key, value in headers.items():
            handler.send_header(key, value)
        if payload is not None:
            handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if method != "HEAD":
            handler.wfile.write(data)

    def _check_token(self, handler, path: str) -> None:
        if path in ("/", "/sites.json") or re.fullmatch(r"/(compute|network|image|reservation)(/v[\d.]+)?", path):
            return  # version discovery documents need no token
        if handler.headers.get("X-Auth-Token") != self._token_id:
            raise HTTPError(
                401, {"error": {"code": 401, "message": "The request you have made requires authentication."}}
            )

    _token_id = "fake-token-" + uuid.uuid4().hex

    def _route(self, method, path, query, body, headers):
        for prefix, handler in (
            ("/identity", self._identity),
            ("/reservation", self._blazar),
            ("/compute", self._nova),
            ("/network", self._neutron),
            ("/image", self._glance),
        ):
            if path == prefix or path.startswith(prefix + "/"):
                return handler(method, path[len(prefix) :] or "/", query, body, headers)
        if path == "/sites.json":
            return 200, {
                "items": [
                    {
                        "name": REGION,
                        "web": self.url,
                        "location": "here",
                        "site_class": "core",
                        "user_support_contact": "",
                    }
                ]
            }
        raise HTTPError(404, {"error": f"no route for {method} {path}"})

    # -- Keystone -------------------------------------------------------------

    def _identity(self, method, path, query, body, headers):
        base = f"{self.url}/identity/v3"
        version = {
            "id": "v3.14",
            "status": "stable",
            "updated": "2020-04-07T00:00:00Z",
            "links": [{"rel": "self", "href": base + "/"}],
            "media-types": [{"base": "application/json", "type": "application/vnd.openstack.identity-v3+json"}],
        }
        if path in ("/", ""):
            return 300, {"versions": {"values": [version]}}
        if path == "/v3" and method == "GET":
            return 200, {"version": version}
        if path == "/v3/auth/tokens" and method == "POST":
            identity = body["auth"]["identity"]
            if "application_credential" in identity["methods"]:
                credential = identity["application_credential"]
                if credential.get("id") != APP_CRED_ID or credential.get("secret") != APP_CRED_SECRET:
                    raise HTTPError(
                        401,
                        {"error": {"code": 401, "title": "Unauthorized", "message": "Invalid application credential"}},
                    )
            elif "token" in identity["methods"]:
                if identity["token"].get("id") != "a-user-token":
                    raise HTTPError(401, {"error": {"code": 401, "title": "Unauthorized", "message": "Invalid token"}})
            else:
                raise HTTPError(401, {"error": {"code": 401, "message": f"unsupported methods {identity['methods']}"}})
            catalog = [
                {
                    "id": service_type,
                    "type": service_type,
                    "name": name,
                    "endpoints": [
                        {
                            "id": f"{service_type}-{interface}",
                            "interface": interface,
                            "region": REGION,
                            "region_id": REGION,
                            "url": url,
                        }
                        for interface in ("public", "internal", "admin")
                    ],
                }
                for service_type, name, url in (
                    ("identity", "keystone", f"{self.url}/identity/v3"),
                    ("reservation", "blazar", f"{self.url}/reservation/v1"),
                    ("compute", "nova", f"{self.url}/compute/v2.1"),
                    ("network", "neutron", f"{self.url}/network"),
                    ("image", "glance", f"{self.url}/image"),
                )
            ]
            # The body keystoneauth1.fixture.V3Token builds (that fixture needs the
            # `fixtures` package, which this project does not install).
            domain = {"id": "default", "name": "Default"}
            token = {
                "token": {
                    "methods": identity["methods"],
                    "issued_at": _now().strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
                    "expires_at": (_now() + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
                    "user": {"id": USER_ID, "name": USER_NAME, "domain": domain},
                    "project": {"id": PROJECT_ID, "name": PROJECT_NAME, "domain": domain},
                    "roles": [{"id": "role-member", "name": "member"}],
                    "catalog": catalog,
                    "audit_ids": [uuid.uuid4().hex[:22]],
                }
            }
            headers["X-Subject-Token"] = self._token_id
            return 201, token
        raise HTTPError(404, {"error": f"keystone: no route for {method} {path}"})

    # -- Blazar ---------------------------------------------------------------

    def _lease_view(self, lease: dict) -> dict:
        view = copy.deepcopy(lease)
        for key in ("start_date", "end_date"):
            view[key] = lease[key].strftime(LEASE_FORMAT)
        view["created_at"] = lease["created_at"].strftime(CREATED_FORMAT)
        view["updated_at"] = None
        return view

    def _free_hosts(self, properties: list, start: datetime, end: datetime) -> list[dict]:
        """The hosts that match a reservation's resource_properties and no lease holds between start and end."""
        busy = {host_id for host_id, s, e in self.foreign_allocations if s < end and start < e}
        for lease in self.leases.values():
            if lease["start_date"] < end and start < lease["end_date"]:
                for reservation in lease["reservations"]:
                    busy.update(reservation.get("_hosts", []))
        return [host for host in self.hosts if _matches(host, properties) and host["id"] not in busy]

    def _blazar(self, method, path, query, body, headers):
        if path in ("/", ""):
            return 300, {
                "versions": [
                    {
                        "id": "v1.0",
                        "status": "CURRENT",
                        "links": [{"rel": "self", "href": f"{self.url}/reservation/v1/"}],
                    }
                ]
            }
        if path == "/v1" and method == "GET":
            return 200, {
                "version": {
                    "id": "v1.0",
                    "status": "CURRENT",
                    "links": [{"rel": "self", "href": f"{self.url}/reservation/v1/"}],
                }
            }
        path = path.removeprefix("/v1")
        if path == "/leases" and method == "GET":  # a project sees its own leases only
            own = [lease for lease in self.leases.values() if lease["project_id"] == PROJECT_ID]
            return 200, {"leases": [self._lease_view(lease) for lease in own]}
        if path == "/leases" and method == "POST":
            return self._create_lease(body)
        match = re.fullmatch(r"/leases/([^/]+)", path)
        if match:
            lease = self.leases.get(match.group(1))
            if lease is None:
                raise HTTPError(
                    404,
                    {
                        "error_code": 404,
                        "error_name": "LeaseNotFound",
                        "error_message": f"Object with {{'lease_id': '{match.group(1)}'}} not found",
                    },
                )
            if lease["project_id"] != PROJECT_ID:  # Blazar's policy: admin or owner
                action = {"GET": "get", "PUT": "put", "DELETE": "delete"}.get(method, method.lower())
                raise HTTPError(
                    403,
                    {
                        "error_code": 403,
                        "error_name": "PolicyNotAuthorized",
                        "error_message": f"Policy doesn't allow blazar:leases:{action} to be performed.",
                    },
                )
            if method == "GET":
                self._advance_lease(lease)
                return 200, {"lease": self._lease_view(lease)}
            if method == "DELETE":
                if self.fail.get("lease_delete"):
                    raise HTTPError(
                        500,
                        {
                            "error_code": 500,
                            "error_name": "BlazarException",
                            "error_message": "injected: lease deletion failed",
                        },
                    )
                self._end_lease(lease)
                return 204, None
            if method == "PUT":
                if self.fail.get("lease_extend"):
                    raise _blazar_error("NotEnoughHostsAvailable", "Not enough hosts available")
                if body.get("end_date"):
                    lease["end_date"] = _parse_api_date(body["end_date"])
                return 200, {"lease": self._lease_view(lease)}
        if path == "/os-hosts" and method == "GET":
            return 200, {"hosts": [dict(host, reservable=True) for host in self.hosts]}
        if path == "/os-hosts/allocations" and method == "GET":
            allocations = []
            for host in self.hosts:
                reservations = [
                    {
                        "id": f"foreign-{i}",
                        "lease_id": f"foreign-{i}",
                        "start_date": s.strftime(LEASE_FORMAT),
                        "end_date": e.strftime(LEASE_FORMAT),
                    }
                    for i, (host_id, s, e) in enumerate(self.foreign_allocations)
                    if host_id == host["id"]
                ]
                for lease in self.leases.values():
                    for reservation in lease["reservations"]:
                        if host["id"] in reservation.get("_hosts", []):
                            reservations.append(
                                {
                                    "id": reservation["id"],
                                    "lease_id": lease["id"],
                                    "start_date": lease["start_date"].strftime(LEASE_FORMAT),
                                    "end_date": lease["end_date"].strftime(LEASE_FORMAT),
                                }
                            )
                allocations.append({"resource_id": host["id"], "reservations": reservations})
            return 200, {"allocations": allocations}
        raise HTTPError(404, {"error": f"blazar: no route for {method} {path}"})

    def book_lease(
        self,
        name: str,
        node_type: str = "gpu_p100",
        count: int = 1,
        hours: float = 24,
        start: datetime | None = None,
        floating_ips: int = 0,
        node_name: str = "",
        project_id: str = PROJECT_ID,
    ) -> dict:
        """A lease made outside our tool, as the dashboard makes one: `count` nodes by node type (and a
        node's name), from `start` (default now) for `hours`, with `floating_ips` reserved addresses; of
        our project or another's. Returns Blazar's view of it."""
        start = start or _now()
        conditions = [["==", "$node_type", node_type]] + ([["==", "$node_name", node_name]] if node_name else [])
        properties = conditions[0] if len(conditions) == 1 else ["and", *conditions]
        reservations = [  # count 0: a lease of addresses only
            {
                "resource_type": "physical:host",
                "min": count,
                "max": count,
                "resource_properties": json.dumps(properties),
                "hypervisor_properties": "",
            }
        ][: 1 if count else 0]
        if floating_ips:
            reservations.append(
                {"resource_type": "virtual:floatingip", "network_id": "net-public", "amount": floating_ips}
            )
        body = {
            "name": name,
            "start_date": start.strftime("%Y-%m-%d %H:%M"),
            "end_date": (start + timedelta(hours=hours)).strftime("%Y-%m-%d %H:%M"),
            "reservations": reservations,
            "events": [],
        }
        with self.lock:
            _, answer = self._create_lease(body, project_id=project_id)
            lease = self.leases[answer["lease"]["id"]]
            self._advance_lease(lease)
            return self._lease_view(lease)

    def _create_lease(self, body, project_id: str = PROJECT_ID):
        if self.fail.get("lease_create") == "restricted_credential":
            # Blazar makes a Keystone trust for the lease; a restricted application credential may not.
            raise _blazar_error("BlazarException", "An unknown exception occurred")
        if any(lease["name"] == body["name"] and lease["project_id"] == project_id for lease in self.leases.values()):
            raise HTTPError(
                409,
                {
                    "error_code": 409,
                    "error_name": "LeaseNameAlreadyExists",
                    "error_message": f"The lease with name: {body['name']} already exists",
                },
            )
        start = _parse_api_date(body["start_date"])
        end = _parse_api_date(body["end_date"])
        lease_id = str(uuid.uuid4())
        reservations = []
        for request in body["reservations"]:
            reservation = {
                "id": str(uuid.uuid4()),
                "lease_id": lease_id,
                "status": "pending",
                "resource_type": request["resource_type"],
            }
            if request["resource_type"] == "physical:host":
                properties = json.loads(request.get("resource_properties") or "[]")
                count = int(request["min"])
                free = self._free_hosts(properties, start, end)
                if self.fail.get("lease_create") == "no_hosts" or len(free) < count:
                    raise _blazar_error("NotEnoughHostsAvailable", "Not enough hosts available")
                reservation.update(
                    min=count,
                    max=count,
                    resource_properties=request.get("resource_properties"),
                    hypervisor_properties="",
                    _hosts=[h["id"] for h in free[:count]],
                )
            elif request["resource_type"] == "virtual:floatingip":
                if self.fail.get("lease_create") == "no_fips":
                    raise _blazar_error("NotEnoughFloatingIPAvailable", "Not enough floating IPs available")
                if request.get("network_id") not in self.networks:
                    raise HTTPError(
                        400, {"error_code": 400, "error_message": f"network {request.get('network_id')} not found"}
                    )
                reservation.update(
                    network_id=request["network_id"], amount=int(request["amount"]), required_floatingips=[]
                )
            else:
                raise HTTPError(
                    400,
                    {"error_code": 400, "error_message": f"fake: unsupported resource type {request['resource_type']}"},
                )
            reservations.append(reservation)
        lease = {
            "id": lease_id,
            "name": body["name"],
            "status": "PENDING",
            "start_date": start,
            "end_date": end,
            "created_at": _now(),
            "user_id": USER_ID if project_id == PROJECT_ID else "u" + "9" * 31,
            "project_id": project_id,
            "trust_id": "trust",
            "reservations": reservations,
            "events": [],
            "degraded": False,
        }
        self.leases[lease_id] = lease
        return 201, {"lease": self._lease_view(lease)}

    def _advance_lease(self, lease: dict) -> None:
        """PENDING -> ACTIVE (creating the reserved floating IPs) after some polls, or -> ERROR if injected."""
        if lease["status"] not in ("PENDING", "STARTING") or lease["start_date"] > _now():  # pending until its start
            return
        if lease["status"] == "PENDING" and lease["start_date"] > lease["created_at"]:
            lease["status"] = "STARTING"  # booked ahead, its start has come: Blazar starts it
            return
        polls = self._poll_counts[lease["id"]] = self._poll_counts.get(lease["id"], 0) + 1
        if polls <= self.lease_polls_to_active:
            return
        if self.fail.get("lease_status") == "ERROR":
            lease["status"] = "ERROR"
            return
        lease["status"] = "ACTIVE"
        for reservation in lease["reservations"]:
            reservation["status"] = "active"
            if reservation["resource_type"] == "virtual:floatingip":
                for _ in range(reservation["amount"]):
                    fip = self._new_floatingip(
                        reservation["network_id"], tags=["blazar", f"reservation:{reservation['id']}"]
                    )
                    reservation["required_floatingips"].append(fip["floating_ip_address"])

    def _end_lease(self, lease: dict) -> None:
        """What Blazar does when a lease is deleted: its instances and reserved IPs go with it."""
        node_reservations = {r["id"] for r in lease["reservations"] if r["resource_type"] == "physical:host"}
        for server_id, server in list(self.servers.items()):
            if server["_reservation"] in node_reservations:
                self._delete_server(server_id)
        tags = {f"reservation:{r['id']}" for r in lease["reservations"]}
        for fip_id, fip in list(self.floatingips.items()):
            if tags.intersection(fip["tags"]):
                del self.floatingips[fip_id]
        del self.leases[lease["id"]]

    # -- Nova -----------------------------------------------------------------

    def _nova(self, method, path, query, body, headers):
        version = {
            "id": "v2.1",
            "status": "CURRENT",
            "version": "2.96",
            "min_version": "2.1",
            "updated": "2013-07-23T11:33:21Z",
            "links": [{"rel": "self", "href": f"{self.url}/compute/v2.1/"}],
        }
        if path in ("/", ""):
            return 200, {"versions": [version]}
        if path == "/v2.1" and method == "GET":
            return 200, {"version": version}
        path = path.removeprefix("/v2.1")
        if path == "/os-keypairs":
            if method == "GET":
                return 200, {"keypairs": [{"keypair": self._keypair_view(k)} for k in self.keypairs.values()]}
            if method == "POST":
                request = body["keypair"]
                if request["name"] in self.keypairs:
                    raise HTTPError(
                        409,
                        {
                            "conflictingRequest": {
                                "code": 409,
                                "message": f"Key pair '{request['name']}' already exists.",
                            }
                        },
                    )
                self.keypairs[request["name"]] = {
                    "name": request["name"],
                    "public_key": request["public_key"],
                    "fingerprint": fingerprint(request["public_key"]),
                    "type": request.get("type", "ssh"),
                }
                return 200, {"keypair": self._keypair_view(self.keypairs[request["name"]])}
        match = re.fullmatch(r"/os-keypairs/([^/]+)", path)
        if match:
            keypair = self.keypairs.get(match.group(1))
            if keypair is None:
                raise HTTPError(
                    404,
                    {
                        "itemNotFound": {
                            "code": 404,
                            "message": f"Keypair {match.group(1)} not found for user {USER_ID}",
                        }
                    },
                )
            if method == "GET":
                return 200, {"keypair": self._keypair_view(keypair)}
            if method == "DELETE":
                del self.keypairs[keypair["name"]]
                return 202, None
        if path in ("/flavors", "/flavors/detail") and method == "GET":
            return 200, {"flavors": [self._flavor_view(f) for f in self.flavors.values()]}
        match = re.fullmatch(r"/flavors/([^/]+)(/os-extra_specs)?", path)
        if match and method == "GET":
            flavor = self.flavors.get(match.group(1))
            if flavor is None:
                raise HTTPError(
                    404, {"itemNotFound": {"code": 404, "message": f"Flavor {match.group(1)} could not be found."}}
                )
            if match.group(2):
                return 200, {"extra_specs": {}}
            return 200, {"flavor": self._flavor_view(flavor)}
        if path in ("/servers", "/servers/detail") and method == "GET":
            servers = [self._server_view(s) for s in self.servers.values()]
            if "name" in query:  # Nova filters by regular expression
                servers = [s for s in servers if re.search(query["name"], s["name"])]
            return 200, {"servers": servers}
        if path == "/servers" and method == "POST":
            if self.fail.get("member_only"):
                raise HTTPError(
                    403, {"forbidden": {"code": 403, "message": "Policy doesn't allow os_compute_api:servers:create to be performed."}}
                )
            return self._create_server(body)
        match = re.fullmatch(r"/servers/([^/]+)", path)
        if match:
            server = self.servers.get(match.group(1))
            if server is None:
                raise HTTPError(
                    404, {"itemNotFound": {"code": 404, "message": f"Instance {match.group(1)} could not be found."}}
                )
            if method == "GET":
                self._advance_server(server)
                return 200, {"server": self._server_view(server)}
            if method == "DELETE":
                if self.fail.get("server_delete"):
                    raise HTTPError(500, {"computeFault": {"code": 500, "message": "injected: server deletion failed"}})
                self._delete_server(server["id"])
                return 204, None
        raise HTTPError(404, {"itemNotFound": {"code": 404, "message": f"nova: no route for {method} {path}"}})

    @staticmethod
    def _keypair_view(keypair: dict) -> dict:
        return dict(keypair, user_id=USER_ID, created_at="2024-01-01T00:00:00.000000", deleted=False, id=1)

    @staticmethod
    def _flavor_view(flavor: dict) -> dict:
        return dict(
            flavor,
            ram=1,
            disk=1,
            vcpus=1,
            swap="",
            rxtx_factor=1.0,
            description=None,
            extra_specs={},
            links=[],
            **{"OS-FLV-EXT-DATA:ephemeral": 0, "OS-FLV-DISABLED:disabled": False, "os-flavor-access:is_public": True},
        )

    def _create_server(self, body):
        request = body["server"]
        hints = body.get("os:scheduler_hints") or body.get("OS-SCH-HNT:scheduler_hints") or {}
        reservation_id = hints.get("reservation")
        reservation = next(
            (
                r
                for lease in self.leases.values()
                if lease["status"] == "ACTIVE"
                for r in lease["reservations"]
                if r["id"] == reservation_id and r["resource_type"] == "physical:host"
            ),
            None,
        )
        if reservation is None:
            raise HTTPError(
                400,
                {
                    "badRequest": {
                        "code": 400,
                        "message": f"reservation {reservation_id} is not an active host reservation",
                    }
                },
            )
        if request.get("key_name") not in self.keypairs:
            raise HTTPError(
                400, {"badRequest": {"code": 400, "message": f"Invalid key_name provided: {request.get('key_name')}"}}
            )
        if request.get("imageRef") not in self.images or request.get("flavorRef") not in self.flavors:
            raise HTTPError(400, {"badRequest": {"code": 400, "message": "bad image or flavor"}})
        in_use = sum(1 for s in self.servers.values() if s["_reservation"] == reservation_id)
        if in_use >= reservation["max"]:
            raise HTTPError(
                400,
                {
                    "badRequest": {
                        "code": 400,
                        "message": "No valid host was found. There are not enough hosts available.",
                    }
                },
            )
        network_id = request["networks"][0]["uuid"]
        server_id = str(uuid.uuid4())
        fixed = f"10.52.0.{next(self._fixed)}"
        port_id = str(uuid.uuid4())
        self.ports[port_id] = {
            "id": port_id,
            "device_id": server_id,
            "device_owner": "compute:nova",
            "network_id": network_id,
            "mac_address": "fa:16:3e:00:00:01",
            "status": "ACTIVE",
            "fixed_ips": [{"ip_address": fixed, "subnet_id": "subnet-1"}],
            "name": "",
            "tags": [],
            "project_id": PROJECT_ID,
            "admin_state_up": True,
        }
        self.servers[server_id] = {
            "id": server_id,
            "name": request["name"],
            "status": "BUILD",
            "key_name": request["key_name"],
            "image": request["imageRef"],
            "flavor": request["flavorRef"],
            "network": self.networks[network_id]["name"],
            "fixed_ip": fixed,
            "port_id": port_id,
            "_reservation": reservation_id,
            "created": _now().strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        return 202, {
            "server": {
                "id": server_id,
                "links": [],
                "OS-DCF:diskConfig": "MANUAL",
                "security_groups": [{"name": "default"}],
            }
        }

    def _advance_server(self, server: dict) -> None:
        if server["status"] != "BUILD":
            return
        polls = self._poll_counts[server["id"]] = self._poll_counts.get(server["id"], 0) + 1
        if polls <= self.server_polls_to_active:
            return
        server["status"] = "ERROR" if self.fail.get("server_status") == "ERROR" else "ACTIVE"

    def _delete_server(self, server_id: str) -> None:
        server = self.servers.pop(server_id)
        self.ports.pop(server["port_id"], None)
        for fip in self.floatingips.values():  # Neutron disassociates, never deletes, a floating IP
            if fip["port_id"] == server["port_id"]:
                fip.update(port_id=None, fixed_ip_address=None, status="DOWN")

    def _server_view(self, server: dict) -> dict:
        addresses = [
            {
                "addr": server["fixed_ip"],
                "version": 4,
                "OS-EXT-IPS:type": "fixed",
                "OS-EXT-IPS-MAC:mac_addr": "fa:16:3e:00:00:01",
            }
        ]
        for fip in self.floatingips.values():
            if fip["port_id"] == server["port_id"]:
                addresses.append(
                    {
                        "addr": fip["floating_ip_address"],
                        "version": 4,
                        "OS-EXT-IPS:type": "floating",
                        "OS-EXT-IPS-MAC:mac_addr": "fa:16:3e:00:00:01",
                    }
                )
        view = {
            "id": server["id"],
            "name": server["name"],
            "status": server["status"],
            "addresses": {server["network"]: addresses},
            "key_name": server["key_name"],
            "image": {"id": server["image"], "links": []},
            "flavor": {
                "original_name": self.flavors[server["flavor"]]["name"],
                "vcpus": 1,
                "ram": 1,
                "disk": 1,
                "ephemeral": 0,
                "swap": 0,
                "extra_specs": {},
            },
            "created": server["created"],
            "updated": server["created"],
            "hostId": "host-hash",
            "host_status": "UP",
            "locked": False,
            "metadata": {},
            "tenant_id": PROJECT_ID,
            "user_id": USER_ID,
            "links": [],
            "tags": [],
            "security_groups": [],
            "OS-EXT-STS:vm_state": server["status"].lower(),
            "OS-EXT-STS:task_state": None,
            "OS-EXT-STS:power_state": 1,
            "OS-EXT-SRV-ATTR:hypervisor_hostname": "gpu_p100-0",
            "os-extended-volumes:volumes_attached": [],
        }
        if server["status"] == "ERROR":
            view["fault"] = {
                "code": 500,
                "message": "injected: deploy failed on the node (No valid host was found)",
                "created": server["created"],
            }
        return view

    # -- Neutron --------------------------------------------------------------

    def _new_floatingip(self, network_id: str, tags: list[str], description: str = "") -> dict:
        used = {f["floating_ip_address"] for f in self.floatingips.values()}
        address = next(a for a in self.address_pool if a not in used)
        fip = {
            "id": str(uuid.uuid4()),
            "floating_ip_address": address,
            "floating_network_id": network_id,
            "port_id": None,
            "fixed_ip_address": None,
            "router_id": None,
            "status": "DOWN",
            "tags": tags,
            "description": description,
            "project_id": PROJECT_ID,
            "tenant_id": PROJECT_ID,
            "port_details": None,
            "dns_domain": "",
            "dns_name": "",
            "qos_policy_id": None,
            "revision_number": 0,
            "port_forwardings": [],
            "created_at": "2024-01-01T00:00:00Z",
            "updated_at": "2024-01-01T00:00:00Z",
        }
        self.floatingips[fip["id"]] = fip
        return fip

    @staticmethod
    def _filter(items: list[dict], query: dict) -> list[dict]:
        """Neutron's list filters: ?name=...&device_id=... (exact match)."""
        for key, value in query.items():
            if key in ("fields", "limit", "marker", "sort_key", "sort_dir", "page_reverse"):
                continue
            items = [
                item
                for item in items
                if str(item.get(key)) == value or (isinstance(item.get(key), list) and value in item[key])
            ]
        return items

    def _neutron(self, method, path, query, body, headers):
        version = {"id": "v2.0", "status": "CURRENT", "links": [{"rel": "self", "href": f"{self.url}/network/v2.0/"}]}
        if path in ("/", ""):
            return 200, {"versions": [version]}
        if path == "/v2.0" and method == "GET":
            return 200, {"resources": []}
        path = path.removeprefix("/v2.0")
        collections = {"networks": self.networks, "floatingips": self.floatingips, "ports": self.ports}
        match = re.fullmatch(r"/(networks|floatingips|ports|subnets)(?:/([^/]+))?", path)
        if not match:
            raise HTTPError(
                404,
                {
                    "NeutronError": {
                        "type": "HTTPNotFound",
                        "message": f"neutron: no route for {method} {path}",
                        "detail": "",
                    }
                },
            )
        kind, item_id = match.groups()
        collection = collections.get(kind, {})
        singular = kind[:-1] if kind != "floatingips" else "floatingip"
        if item_id is None and method == "GET":
            return 200, {kind: self._filter(list(collection.values()), query)}
        if kind == "floatingips" and item_id is None and method == "POST":
            request = body["floatingip"]
            if request["floating_network_id"] not in self.networks:
                raise HTTPError(
                    404, {"NeutronError": {"type": "NetworkNotFound", "message": "network not found", "detail": ""}}
                )
            fip = self._new_floatingip(
                request["floating_network_id"], tags=[], description=request.get("description", "")
            )
            return 201, {"floatingip": fip}
        item = collection.get(item_id)
        if item is None:
            raise HTTPError(
                404,
                {
                    "NeutronError": {
                        "type": f"{singular.capitalize()}NotFound",
                        "message": f"{singular} {item_id} could not be found",
                        "detail": "",
                    }
                },
            )
        if method == "GET":
            return 200, {singular: item}
        if kind == "floatingips" and method == "PUT":
            if self.fail.get("fip_associate"):
                raise HTTPError(
                    500,
                    {
                        "NeutronError": {
                            "type": "HTTPInternalServerError",
                            "message": "injected: floating IP association failed",
                            "detail": "",
                        }
                    },
                )
            port_id = body["floatingip"].get("port_id")
            if port_id is not None and port_id not in self.ports:
                raise HTTPError(
                    404,
                    {"NeutronError": {"type": "PortNotFound", "message": f"port {port_id} not found", "detail": ""}},
                )
            item["port_id"] = port_id
            item["fixed_ip_address"] = self.ports[port_id]["fixed_ips"][0]["ip_address"] if port_id else None
            item["status"] = "ACTIVE" if port_id else "DOWN"
            return 200, {"floatingip": item}
        if kind == "floatingips" and method == "DELETE":
            if self.fail.get("fip_delete"):
                raise HTTPError(
                    500,
                    {
                        "NeutronError": {
                            "type": "HTTPInternalServerError",
                            "message": "injected: floating IP deletion failed",
                            "detail": "",
                        }
                    },
                )
            del self.floatingips[item_id]
            return 204, None
        raise HTTPError(
            405, {"NeutronError": {"type": "HTTPMethodNotAllowed", "message": f"{method} {path}", "detail": ""}}
        )

    # -- Glance -----------------------------------------------------------------

    def _glance(self, method, path, query, body, headers):
        version = {"id": "v2.16", "status": "CURRENT", "links": [{"rel": "self", "href": f"{self.url}/image/v2/"}]}
        if path in ("/", "", "/versions"):
            return 300, {"versions": [version]}
        if path == "/v2/schemas/image":
            return 200, {
                "name": "image",
                "properties": {"id": {"type": "string"}, "name": {"type": ["null", "string"]}},
                "additionalProperties": True,
                "links": [],
            }
        if path == "/v2/schemas/images":
            return 200, {"name": "images", "properties": {"images": {"type": "array"}}, "links": []}
        if path == "/v2/images" and method == "GET":
            if self.fail.get("member_only"):
                raise HTTPError(
                    403, {"forbidden": {"code": 403, "message": "You are not authorized to complete get_images action."}}
                )
            images = list(self.images.values())
            if "name" in query:
                images = [i for i in images if i["name"] == query["name"]]
            return 200, {"images": images, "first": "/v2/images", "schema": "/v2/schemas/images"}
        match = re.fullmatch(r"/v2/images/([^/]+)", path)
        if match and method == "GET":
            image = self.images.get(match.group(1))
            if image is None:
                raise HTTPError(404, {"message": f"No image found with ID {match.group(1)}"})
            return 200, image
        raise HTTPError(404, {"message": f"glance: no route for {method} {path}"})


# ---- what the tests of the chameleon target share

# A syntactically valid ed25519 public key (the fake computes Nova's fingerprint from it).
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGn8m6Qb0b8Z1i8v4T2m6s2bXr1m5xv7V1sQeF3n9YcR test@lab"
NODE_ADDRESSES = [f"127.0.0.{i}" for i in range(10, 14)]  # the fake's first floating IPs


class SSHBanner:
    """Accepts TCP on the given loopback addresses (one port) and greets like sshd."""

    def __init__(self, addresses: list[str]):
        self.sockets = []
        port = 0
        for address in addresses:
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((address, port))
            port = listener.getsockname()[1]
            listener.listen(8)
            self.sockets.append(listener)
            threading.Thread(target=self._serve, args=(listener,), daemon=True).start()
        self.port = port

    def _serve(self, listener):
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                connection.sendall(b"SSH-2.0-OpenSSH_9.6 fake\r\n")

    def close(self):
        for listener in self.sockets:
            listener.close()

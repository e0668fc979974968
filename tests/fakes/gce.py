"""A local Compute Engine v1 REST server for the few endpoints gpufleet uses.

No GCE emulator exists; this speaks the wire format google-cloud-compute's REST transport
sends and parses (camelCase JSON, int64 as strings, operations, JSON error bodies).
- instances: insert (honours `requestId` de-duplication, 409 on an existing name), get,
  delete, aggregated list; zone operations: get, wait, list (with an operationType filter);
  machine types: list.
- `inject_http(...)` answers the next insert with an HTTP error body; `inject_operation(...)`
  makes the next insert's operation finish with an error (as GCE reports stockouts);
  `preempt(zone, name)` records a `compute.instances.preempted` operation.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

BASE = "https://www.googleapis.com/compute/v1"
_ROUTES = [
    ("POST", r"/projects/([^/]+)/zones/([^/]+)/instances", "insert"),
    ("GET", r"/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)", "get"),
    ("DELETE", r"/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)", "delete"),
    ("GET", r"/projects/([^/]+)/aggregated/instances", "aggregated"),
    ("POST", r"/projects/([^/]+)/zones/([^/]+)/operations/([^/]+)/wait", "wait"),
    ("GET", r"/projects/([^/]+)/zones/([^/]+)/operations/([^/]+)", "get_operation"),
    ("GET", r"/projects/([^/]+)/zones/([^/]+)/operations", "list_operations"),
    ("GET", r"/projects/([^/]+)/zones/([^/]+)/machineTypes", "machine_types"),
]
MACHINE_TYPES = [
    {"name": "g2-standard-4", "guestCpus": 4, "memoryMb": 16384, "accel": ("nvidia-l4", 1)},
    {
        "name": "a3-highgpu-8g",
        "guestCpus": 208,
        "memoryMb": 1916928,
        "accel": ("nvidia-h100-80gb", 8),
    },
    {"name": "n2-standard-4", "guestCpus": 4, "memoryMb": 16384, "accel": None},
]


class HttpFault(Exception):
    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


@dataclass
class OperationFault:
    code: str
    message: str
    http_status: int


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class FakeGce:
    def __init__(self) -> None:
        self.instances: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.request_ids: dict[str, str] = {}
        self.http_faults: list[HttpFault] = []
        self.operation_faults: list[OperationFault] = []
        self.inserts = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeGce:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def inject_http(self, status: int, message: str, reason: str) -> None:
        with self._lock:
            self.http_faults.append(HttpFault(status, message, reason))

    def inject_operation(self, code: str, message: str, http_status: int = 503) -> None:
        with self._lock:
            self.operation_faults.append(OperationFault(code, message, http_status))

    def clear_faults(self) -> None:
        with self._lock:
            self.http_faults.clear()
            self.operation_faults.clear()

    def preempt(self, zone: str, name: str, project: str = "gpufleet-test") -> None:
        with self._lock:
            self._operation(project, zone, "compute.instances.preempted", name, done=True)

    # -- endpoints --------------------------------------------------------------------

    def insert(self, query: dict[str, str], body: dict[str, Any], project: str, zone: str) -> Any:
        with self._lock:
            self.inserts += 1
            rid = query.get("requestId")
            if rid and rid in self.request_ids:
                return self.operations[self.request_ids[rid]]
            if self.http_faults:
                raise self.http_faults.pop(0)
            name = body["name"]
            if (project, zone, name) in self.instances:
                raise HttpFault(
                    409,
                    f"The resource 'projects/{project}/zones/{zone}/instances/{name}' "
                    "already exists",
                    "alreadyExists",
                )
            op = self._operation(project, zone, "insert", name)
            if self.operation_faults:
                fault = self.operation_faults.pop(0)
                op["error"] = {"errors": [{"code": fault.code, "message": fault.message}]}
                op["httpErrorStatusCode"] = fault.http_status
            else:
                self.instances[(project, zone, name)] = self._instance(project, zone, body)
            if rid:
                self.request_ids[rid] = op["name"]
            return op

    def get(self, query: dict[str, str], body: Any, project: str, zone: str, name: str) -> Any:
        with self._lock:
            return self._existing(project, zone, name)

    def delete(self, query: dict[str, str], body: Any, project: str, zone: str, name: str) -> Any:
        with self._lock:
            self._existing(project, zone, name)
            del self.instances[(project, zone, name)]
            return self._operation(project, zone, "delete", name)

    def aggregated(self, query: dict[str, str], body: Any, project: str) -> Any:
        with self._lock:
            items: dict[str, Any] = {}
            for (p, zone, _), instance in self.instances.items():
                if p == project:
                    items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(
                        instance
                    )
            return {"kind": "compute#instanceAggregatedList", "items": items}

    def wait(self, query: dict[str, str], body: Any, project: str, zone: str, op: str) -> Any:
        with self._lock:
            operation = self._existing_operation(op)
            operation["status"] = "DONE"
            return operation

    def get_operation(self, query: dict[str, str], body: Any, project: str, zone: str, op: str):
        with self._lock:
            return self._existing_operation(op)

    def list_operations(self, query: dict[str, str], body: Any, project: str, zone: str) -> Any:
        wanted = re.fullmatch(r'operationType="([^"]+)"', query.get("filter", ""))
        with self._lock:
            items = [
                op
                for op in self.operations.values()
                if op["zone"].endswith(f"/zones/{zone}")
                and (wanted is None or op["operationType"] == wanted.group(1))
            ]
            return {"kind": "compute#operationList", "items": items}

    def machine_types(self, query: dict[str, str], body: Any, project: str, zone: str) -> Any:
        items = []
        for mt in MACHINE_TYPES:
            item: dict[str, Any] = {
                "name": mt["name"],
                "guestCpus": mt["guestCpus"],
                "memoryMb": mt["memoryMb"],
                "zone": zone,
            }
            if mt["accel"]:
                kind, count = mt["accel"]
                item["accelerators"] = [
                    {"guestAcceleratorType": kind, "guestAcceleratorCount": count}
                ]
            items.append(item)
        return {"kind": "compute#machineTypeList", "items": items}

    # -- helpers ----------------------------------------------------------------------

    def _existing(self, project: str, zone: str, name: str) -> dict[str, Any]:
        instance = self.instances.get((project, zone, name))
        if instance is None:
            raise HttpFault(
                404,
                f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found",
                "notFound",
            )
        return instance

    def _existing_operation(self, name: str) -> dict[str, Any]:
        if name not in self.operations:
            raise HttpFault(404, f"The resource operation '{name}' was not found", "notFound")
        return self.operations[name]

    def _operation(
        self, project: str, zone: str, kind: str, target: str, done: bool = False
    ) -> dict[str, Any]:
        name = f"operation-{uuid.uuid4().hex}"
        op = {
            "kind": "compute#operation",
            "id": str(uuid.uuid4().int % 10**18),
            "name": name,
            "zone": f"{BASE}/projects/{project}/zones/{zone}",
            "operationType": kind,
            "targetLink": f"{BASE}/projects/{project}/zones/{zone}/instances/{target}",
            "status": "DONE" if done else "RUNNING",
            "insertTime": _now(),
            "progress": 100 if done else 0,
        }
        self.operations[name] = op
        return op

    def _instance(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        return {
            **body,
            "kind": "compute#instance",
            "id": str(uuid.uuid4().int % 10**18),
            "zone": f"{BASE}/projects/{project}/zones/{zone}",
            "machineType": f"{BASE}/projects/{project}/{body['machineType']}",
            "status": "RUNNING",
            "creationTimestamp": _now(),
            "networkInterfaces": [
                {**nic, "networkIP": f"10.128.0.{len(self.instances) + 2}"}
                for nic in body.get("networkInterfaces", [])
            ],
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _dispatch(self) -> None:
                parts = urlsplit(self.path)
                path = parts.path.removeprefix("/compute/v1")
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"null")
                for method, pattern, handler in _ROUTES:
                    match = re.fullmatch(pattern, path)
                    if method == self.command and match:
                        try:
                            reply = getattr(fake, handler)(query, body, *match.groups())
                            self._send(200, reply)
                        except HttpFault as fault:
                            self._send(fault.status, _error_body(fault))
                        return
                self._send(404, _error_body(HttpFault(404, f"no route {path}", "notFound")))

            do_GET = do_POST = do_DELETE = _dispatch  # noqa: N815

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                return

        return Handler


def _error_body(fault: HttpFault) -> dict[str, Any]:
    return {
        "error": {
            "code": fault.status,
            "message": fault.message,
            "errors": [{"message": fault.message, "domain": "global", "reason": fault.reason}],
        }
    }

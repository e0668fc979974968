"""A local Lambda Cloud API (v1) for the documented endpoints gpufleet uses.

GET /api/v1/instance-types, GET /api/v1/instances, POST /api/v1/instance-operations/launch,
POST /api/v1/instance-operations/terminate; basic or bearer auth with the API key; errors as
`{"error": {"code", "message", "suggestion"}}` with the documented codes.
`capacity` (type → instances left) drives insufficient-capacity; `quota` drives
global/quota-exceeded; `inject(...)` answers the next launch with any status and code.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API_KEY = "secret-test-key"
TYPES = {
    "gpu_1x_h100_pcie": ("1x H100 (80 GB PCIe)", "H100 (80 GB PCIe)", 249, 1, 26),
    "gpu_8x_h100_sxm5": ("8x H100 (80 GB SXM5)", "H100 (80 GB SXM5)", 2392, 8, 208),
    "gpu_1x_a10": ("1x A10 (24 GB PCIe)", "A10 (24 GB PCIe)", 75, 1, 30),
}
REGIONS = {"us-east-1": "Virginia, USA", "us-west-1": "California, USA"}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class FakeLambdaCloud:
    capacity: dict[tuple[str, str], int] = field(default_factory=dict)
    quota: int = 1000
    instances: dict[str, dict[str, Any]] = field(default_factory=dict)
    faults: list[ApiError] = field(default_factory=list)
    launches: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/api/v1"

    def start(self) -> FakeLambdaCloud:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def inject(self, status: int, code: str, message: str) -> None:
        with self._lock:
            self.faults.append(ApiError(status, code, message))

    def clear_faults(self) -> None:
        with self._lock:
            self.faults.clear()

    def available(self, instance_type: str, region: str) -> int:
        return self.capacity.get((instance_type, region), 100)

    # -- endpoints --------------------------------------------------------------------

    def instance_types(self) -> Any:
        data = {}
        for name, (description, gpu, cents, gpus, vcpus) in TYPES.items():
            data[name] = {
                "instance_type": _type(name, description, gpu, cents, gpus, vcpus),
                "regions_with_capacity_available": [
                    {"name": region, "description": text}
                    for region, text in REGIONS.items()
                    if self.available(name, region) > 0
                ],
            }
        return {"data": data}

    def list_instances(self) -> Any:
        with self._lock:
            return {"data": [i for i in self.instances.values() if i["status"] != "terminated"]}

    def launch(self, body: dict[str, Any]) -> Any:
        with self._lock:
            self.launches += 1
            if self.faults:
                raise self.faults.pop(0)
            name, region = body.get("instance_type_name"), body.get("region_name")
            keys = body.get("ssh_key_names") or []
            if name not in TYPES or region not in REGIONS or len(keys) != 1:
                raise ApiError(400, "global/invalid-parameters", "Invalid launch parameters")
            if int(body.get("quantity", 1)) != 1:
                raise ApiError(400, "global/invalid-parameters", "quantity must be 1")
            live = [i for i in self.instances.values() if i["status"] != "terminated"]
            if len(live) >= self.quota:
                raise ApiError(400, "global/quota-exceeded", "Quota exceeded")
            if self.available(name, region) <= 0:
                raise ApiError(
                    400,
                    "instance-operations/launch/insufficient-capacity",
                    "Not enough capacity to fulfill launch request.",
                )
            self.capacity[(name, region)] = self.available(name, region) - 1
            instance_id = uuid.uuid4().hex
            description, gpu, cents, gpus, vcpus = TYPES[name]
            self.instances[instance_id] = {
                "id": instance_id,
                "name": body.get("name"),
                "ip": f"192.0.2.{len(self.instances) % 250 + 2}",
                "status": "booting",
                "ssh_key_names": keys,
                "file_system_names": body.get("file_system_names", []),
                "region": {"name": region, "description": REGIONS[region]},
                "instance_type": _type(name, description, gpu, cents, gpus, vcpus),
                "hostname": None,
                "jupyter_token": None,
                "jupyter_url": None,
            }
            return {"data": {"instance_ids": [instance_id]}}

    def terminate(self, body: dict[str, Any]) -> Any:
        with self._lock:
            ids = body.get("instance_ids") or []
            for instance_id in ids:
                instance = self.instances.get(instance_id)
                if instance is None or instance["status"] == "terminated":
                    raise ApiError(
                        404, "global/object-does-not-exist", f"Instance {instance_id} not found"
                    )
            terminated = []
            for instance_id in ids:
                self.instances[instance_id]["status"] = "terminated"
                terminated.append(self.instances[instance_id])
            return {"data": {"terminated_instances": terminated}}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self
        routes = {
            ("GET", "/api/v1/instance-types"): lambda _body: fake.instance_types(),
            ("GET", "/api/v1/instances"): lambda _body: fake.list_instances(),
            ("POST", "/api/v1/instance-operations/launch"): fake.launch,
            ("POST", "/api/v1/instance-operations/terminate"): fake.terminate,
        }

        class Handler(BaseHTTPRequestHandler):
            def _dispatch(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"null")
                route = routes.get((self.command, self.path.split("?")[0]))
                try:
                    if not _authorised(self.headers.get("Authorization", "")):
                        raise ApiError(401, "global/invalid-api-key", "API key was invalid")
                    if route is None:
                        raise ApiError(404, "global/invalid-address", "Address not found")
                    self._send(200, route(body))
                except ApiError as err:
                    error = {"code": err.code, "message": err.message, "suggestion": None}
                    self._send(err.status, {"error": error})

            do_GET = do_POST = _dispatch  # noqa: N815

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


def _authorised(header: str) -> bool:
    scheme, _, value = header.partition(" ")
    if scheme == "Bearer":
        return value == API_KEY
    if scheme == "Basic":
        try:
            user = base64.b64decode(value).decode().split(":", 1)[0]
        except ValueError:
            return False
        return user == API_KEY
    return False


def _type(name: str, description: str, gpu: str, cents: int, gpus: int, vcpus: int) -> Any:
    return {
        "name": name,
        "description": description,
        "gpu_description": gpu,
        "price_cents_per_hour": cents,
        "specs": {"vcpus": vcpus, "memory_gib": vcpus * 8, "storage_gib": 512, "gpus": gpus},
    }

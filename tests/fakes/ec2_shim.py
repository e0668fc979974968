"""A thin EC2 Query-API front for moto: what moto lacks, spoken in the real wire format.

Everything is forwarded to a moto server except:
- capacity reservations (moto: NotImplemented): CreateCapacityReservation,
  DescribeCapacityReservations, and RunInstances targeting a reservation (checked for
  existence, type, zone and free slots; TerminateInstances frees the slots);
- `ClientToken` idempotency on RunInstances (moto stores the token but launches again):
  same token and parameters → the first reply; other parameters → IdempotentParameterMismatch;
- injected faults: `inject("RunInstances", "InsufficientInstanceCapacity", ...)` answers the
  next matching call with AWS's XML error document, so botocore parses a real error.
"""

from __future__ import annotations

import http.client
import re
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
_TARGET = "CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId"


@dataclass
class Reservation:
    id: str
    instance_type: str
    zone: str
    total: int
    instances: set[str] = field(default_factory=set)

    @property
    def available(self) -> int:
        return self.total - len(self.instances)


@dataclass
class Fault:
    action: str
    code: str
    message: str
    status: int
    times: int
    after: bool = False
    """Carry the call out, then close the connection without an answer (a timeout seen by
    the client after the launch happened) instead of answering the error."""


DROPPED = 0
"""`handle`'s status for "close the connection, answer nothing"."""


class Ec2Shim:
    def __init__(self, moto_port: int) -> None:
        self.moto_port = moto_port
        self.reservations: dict[str, Reservation] = {}
        self.tokens: dict[str, tuple[tuple[tuple[str, str], ...], bytes]] = {}
        self.faults: list[Fault] = []
        self.run_instances_calls = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Ec2Shim:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def inject(
        self, action: str, code: str, message: str = "injected", status: int = 400, times: int = 1
    ) -> None:
        with self._lock:
            self.faults.append(Fault(action, code, message, status, times))

    def drop_reply(self, action: str, times: int = 1) -> None:
        """The next `times` calls of `action` are carried out and their answers lost."""
        with self._lock:
            self.faults.append(Fault(action, "", "", DROPPED, times, after=True))

    def clear_faults(self) -> None:
        with self._lock:
            self.faults.clear()

    # -- request handling ---------------------------------------------------------------

    def _take_fault(self, action: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.action == action and fault.times > 0:
                    fault.times -= 1
                    return fault
        return None

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        form = headers.get("content-type", "").startswith("application/x-www-form-urlencoded")
        params = dict(parse_qsl(body.decode())) if form else {}
        action = params.get("Action", "")
        fault = self._take_fault(action) if action else None
        if fault and fault.after:
            self._carry_out(action, path, headers, body, params)
            return DROPPED, b""
        if fault:
            return fault.status, error_xml(fault.code, fault.message)
        return self._carry_out(action, path, headers, body, params)

    def _carry_out(
        self, action: str, path: str, headers: dict[str, str], body: bytes, params: dict[str, str]
    ) -> tuple[int, bytes]:
        if action == "CreateCapacityReservation":
            return 200, self._create_reservation(params)
        if action == "DescribeCapacityReservations":
            return 200, self._describe_reservations(params)
        if action == "RunInstances":
            return self._run_instances(path, headers, body, params)
        status, reply = self._forward(path, headers, body)
        if action == "TerminateInstances" and status == 200:
            self._free_slots({v for k, v in params.items() if k.startswith("InstanceId.")})
        return status, reply

    def _forward(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.moto_port, timeout=30)
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def _run_instances(
        self, path: str, headers: dict[str, str], body: bytes, params: dict[str, str]
    ) -> tuple[int, bytes]:
        # One launch at a time, like AWS's per-token serialisation.
        with self._lock:
            self.run_instances_calls += 1
            token = params.get("ClientToken")
            fingerprint = tuple(sorted((k, v) for k, v in params.items() if k != "ClientToken"))
            if token and token in self.tokens:
                first, reply = self.tokens[token]
                if first != fingerprint:
                    return 400, error_xml(
                        "IdempotentParameterMismatch",
                        f"The client token {token} was used with different parameters.",
                    )
                return 200, reply
            target = params.get(_TARGET)
            reservation = None
            if target:
                reservation = self.reservations.get(target)
                count = int(params.get("MaxCount", "1"))
                problem = _misfit(reservation, target, params, count)
                if problem:
                    return 400, error_xml(*problem)
            status, reply = self._forward(path, headers, body)
            if status == 200:
                if token:
                    self.tokens[token] = (fingerprint, reply)
                if reservation:
                    reservation.instances |= _instance_ids(reply)
            return status, reply

    def _free_slots(self, instance_ids: set[str]) -> None:
        with self._lock:
            for reservation in self.reservations.values():
                reservation.instances -= instance_ids

    def _create_reservation(self, params: dict[str, str]) -> bytes:
        with self._lock:
            reservation = Reservation(
                id=f"cr-{uuid.uuid4().hex[:17]}",
                instance_type=params["InstanceType"],
                zone=params["AvailabilityZone"],
                total=int(params["InstanceCount"]),
            )
            self.reservations[reservation.id] = reservation
            item = _reservation_xml(reservation, "capacityReservation")
        return _document("CreateCapacityReservationResponse", item)

    def _describe_reservations(self, params: dict[str, str]) -> bytes:
        wanted = {v for k, v in params.items() if k.startswith("CapacityReservationId.")}
        with self._lock:
            items = "".join(
                _reservation_xml(r, "item")
                for r in self.reservations.values()
                if not wanted or r.id in wanted
            )
        return _document(
            "DescribeCapacityReservationsResponse",
            f"<capacityReservationSet>{items}</capacityReservationSet>",
        )

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        shim = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                headers.pop("host", None)
                status, reply = shim.handle(self.path, headers, body)
                if status == DROPPED:
                    self.close_connection = True
                    return
                self.send_response(status)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: object) -> None:
                return

        return Handler


def _misfit(
    reservation: Reservation | None, target: str, params: dict[str, str], count: int
) -> tuple[str, str] | None:
    if reservation is None:
        return (
            "InvalidCapacityReservationId.NotFound",
            f"The capacity reservation ID '{target}' does not exist",
        )
    if params.get("InstanceType") != reservation.instance_type:
        return (
            "InvalidParameterCombination",
            f"The instance type does not match capacity reservation {target}",
        )
    zone = params.get("Placement.AvailabilityZone")
    if zone and zone != reservation.zone:
        return (
            "InvalidParameterCombination",
            f"The Availability Zone does not match capacity reservation {target}",
        )
    if count > reservation.available:
        return (
            "ReservationCapacityExceeded",
            f"The requested number of instances exceeds the available capacity of {target}",
        )
    return None


def error_xml(code: str, message: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code>"
        f"<Message>{escape(message)}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()


def _document(root: str, inner: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="{_NS}">'
        f"<requestId>{uuid.uuid4()}</requestId>{inner}</{root}>"
    ).encode()


def _reservation_xml(r: Reservation, tag: str) -> str:
    return (
        f"<{tag}><capacityReservationId>{r.id}</capacityReservationId>"
        f"<ownerId>123456789012</ownerId><instanceType>{r.instance_type}</instanceType>"
        f"<instancePlatform>Linux/UNIX</instancePlatform>"
        f"<availabilityZone>{r.zone}</availabilityZone><tenancy>default</tenancy>"
        f"<totalInstanceCount>{r.total}</totalInstanceCount>"
        f"<availableInstanceCount>{r.available}</availableInstanceCount>"
        f"<state>active</state><instanceMatchCriteria>targeted</instanceMatchCriteria></{tag}>"
    )


def _instance_ids(reply: bytes) -> set[str]:
    return {m.decode() for m in re.findall(rb"<instanceId>(i-[0-9a-f]+)</instanceId>", reply)}

"""A plane behind a network that can be cut. Its processes run in a network namespace
joined to the root namespace by two veth links — ``data`` (the gateways reach its router)
and ``bus`` (it reaches NATS) — and ``cut`` makes a link lose every packet silently: a
``blackhole`` qdisc on both ends, the neighbours pinned (permanent ARP entries). That is a
cut cable or a partitioned region as the gateway sees it: no RST, no ICMP, no ARP failure,
only silence — which only timeouts can tell from a slow plane.

``ip link set … down`` is another fault: the root side's packets then leave by the default
route, and the far end's carrier loss flushes its neighbours, so its connects fail
(EHOSTUNREACH) once ARP gives up. ``tc netem`` and tc's classifiers are not in this
machine's kernel, iptables and nft not installed; the ``blackhole`` qdisc comes with tc.

Needs root and iproute2. Every name carries a random suffix, so parallel or leftover runs
never clash; the addresses are a 10.x.y.0/29 that no interface or route here uses; ``close``
removes everything and is silent about what is already gone.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import random
import secrets
import socket
import subprocess
import threading
from dataclasses import dataclass


class NetworkSetupError(RuntimeError):
    """An ``ip``/``tc`` command failed (the message has its output)."""


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise NetworkSetupError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")
    return done.stdout


def _unused_subnet() -> str:
    """``10.x.y`` of a /29 that no address or route of this machine overlaps."""
    used = []
    for line in (_run("ip", "-4", "-o", "addr") + _run("ip", "-4", "route")).splitlines():
        words = line.split()
        prefix = words[words.index("inet") + 1] if "inet" in words else words[0]
        with contextlib.suppress(ValueError):  # "default", "blackhole", ...
            used.append(ipaddress.ip_network(prefix, strict=False))
    for _ in range(100):
        base = f"10.{random.randrange(200, 255)}.{random.randrange(256)}"
        if not any(ipaddress.ip_network(f"{base}.0/29").overlaps(u) for u in used):
            return base
    raise NetworkSetupError("no free 10.x.y.0/29 for the test's veth links")


@dataclass(frozen=True)
class Link:
    root_dev: str
    ns_dev: str
    root_ip: str
    ns_ip: str


class PlaneNetwork:
    def __init__(self) -> None:
        suffix = secrets.token_hex(4)
        self.ns = f"gpufleet-cut-{suffix}"
        base = _unused_subnet()
        self.links = {
            name: Link(f"gc{suffix}{name[0]}", name, f"{base}.{4 * i + 1}", f"{base}.{4 * i + 2}")
            for i, name in enumerate(("data", "bus"))
        }

    def open(self) -> PlaneNetwork:
        _run("ip", "netns", "add", self.ns)
        _run("ip", "-n", self.ns, "link", "set", "lo", "up")
        for link in self.links.values():
            _run("ip", "link", "add", link.root_dev, "type", "veth",
                 "peer", "name", link.ns_dev, "netns", self.ns)  # fmt: skip
            _run("ip", "addr", "add", f"{link.root_ip}/30", "dev", link.root_dev)
            _run("ip", "-n", self.ns, "addr", "add", f"{link.ns_ip}/30", "dev", link.ns_dev)
            _run("ip", "link", "set", link.root_dev, "up")
            _run("ip", "-n", self.ns, "link", "set", link.ns_dev, "up")
            # pinned, so that a cut loses packets and never fails an ARP resolution
            _run("ip", "neigh", "replace", link.ns_ip, "lladdr", self._mac(link.ns_dev, self.ns),
                 "dev", link.root_dev, "nud", "permanent")  # fmt: skip
            _run("ip", "-n", self.ns, "neigh", "replace", link.root_ip, "lladdr",
                 self._mac(link.root_dev), "dev", link.ns_dev, "nud", "permanent")  # fmt: skip
        return self

    @staticmethod
    def _mac(dev: str, ns: str | None = None) -> str:
        where = ["-n", ns] if ns else []
        return json.loads(_run("ip", *where, "-j", "link", "show", "dev", dev))[0]["address"]

    def argv(self, command: list[str]) -> list[str]:
        """``command`` run inside the namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.ns, *command]

    def cut(self, *links: str) -> None:
        """Every packet on these links is lost from now on, silently, both ways."""
        for name in links:
            link = self.links[name]
            _run("tc", "qdisc", "replace", "dev", link.root_dev, "root", "blackhole")
            _run("tc", "-n", self.ns, "qdisc", "replace", "dev", link.ns_dev, "root", "blackhole")

    def restore(self, *links: str) -> None:
        for name in links:
            link = self.links[name]
            _run("tc", "qdisc", "del", "dev", link.root_dev, "root")
            _run("tc", "-n", self.ns, "qdisc", "del", "dev", link.ns_dev, "root")

    def close(self) -> None:
        """Remove the links (a veth's peer goes with it) and the namespace. End the
        processes inside first: a namespace lives on while one does."""
        for link in self.links.values():
            with contextlib.suppress(NetworkSetupError):
                _run("ip", "link", "del", link.root_dev)
        with contextlib.suppress(NetworkSetupError):
            _run("ip", "netns", "del", self.ns)


class Relay:
    """TCP from ``host`` (a free port) to ``target``, in threads: how the plane reaches
    the fleet's NATS, which listens on the root namespace's loopback only. The relay is on
    the root side of the ``bus`` link, so a cut of that link silences the plane for NATS
    as a cut between a plane and a remote NATS server does."""

    def __init__(self, host: str, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server((host, 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()  # the target is down (a test stopped NATS): so is the relay
                continue
            server.settimeout(None)
            self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self._listener.close()
        for sock in self._sockets:
            sock.close()

"""The router's state: deployments, their replicas (backends) and admission queues.

Fed with ``set_deployments`` (the desired state) and ``set_replicas`` (the runtime's list):
in the router's own process by ``follower.PlaneFollower`` from the agent's state directory,
in an agent's process by the agent. ``acquire`` returns a backend with a slot taken, waiting in the
deployment's queue while every replica is full, ejected or still starting (scale from zero:
held, not failed); ``release`` frees the slot and dispatches the queue's head. ``eject`` and
``readmit`` record a replica's health; *when* to call them is the dispatcher's policy
(``dispatch.py``) and the prober's (``prober.py``). Time comes from the injected clock only.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import itertools
import logging
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from controlplane.contracts import (
    COUNT_MAX,
    LATENCY_BUCKETS_S,
    DeploymentDesired,
    OutcomeCounters,
    ReplicaStatus,
    TokenCounters,
)
from workloadplane.health import ReplicaHealth
from workloadplane.queue import AdmissionQueue, Waiting
from workloadplane.router.upstream import Abort, UpstreamPool, host_port
from workloadplane.routing import Candidate, HashRing, choose_replica

log = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass
class RouterConfig:
    queue_max_length: int = 1024
    queue_max_wait_s: float = 120.0
    tiers: int = 3
    default_tier: int = 1
    api_keys: dict[str, int] = field(default_factory=dict)
    """SHA-256 hex digest of an API key (``keys.hash_key``) → the best tier it may use;
    empty means no authentication."""
    concurrency_override: int | None = None
    """Per-replica in-flight limit for every deployment (else its target_concurrency)."""
    probe_interval_s: float = 0.5
    probe_timeout_s: float = 1.0
    """A replica that stops answering is ejected within ``hung_deadline_s`` (interval +
    timeout: 1.5 s), and a stream flowing from it is ended then with an SSE error event."""
    readmit_after: int = 2
    first_byte_timeout_s: float = 30.0
    """Deadline for the response head of a streaming request (non-streaming heads come
    only when generation ends, so they rely on the probes). Past it the request is retried
    on another replica, which is not ejected: vLLM sends a stream's head after the prompt's
    preprocessing (chat template, tokenizing, fetching images), and a 2 s deadline that
    ejected took healthy replicas out one by one on long prompts. A hung replica is the
    probes' to eject (``hung_deadline_s``), which ends its waiting requests at once."""
    stream_idle_s: float = 120.0
    """A stream whose replica sends nothing this long (its /health fine: a stalled
    generation) is ended with an SSE error event (``stream_broken``): it held its slot and
    its client for good. Above the longest silence a healthy engine has (vLLM sends no
    keep-alives; a preempted sequence is recomputed in silence)."""
    max_attempts: int = 4
    prefix_min_chars: int = 256
    prefix_chars: int = 1024
    load_factor: float = 1.25
    models_refresh_s: float = 10.0
    max_body_bytes: int = 16 * 1024 * 1024
    """Largest request body (16 MiB: a 1M-token prompt is ~4 MiB of text; room for JSON
    escaping and a few inline images). Larger ones get 413, enforced while reading."""
    max_headers: int = 100
    max_header_bytes: int = 64 * 1024
    """Request line + headers; more headers or bytes get 431."""
    shadow_max_in_flight: int = 32
    """Copies to shadow lanes in flight at once, all lanes together; more are dropped (and
    counted): a shadow never holds the router's memory or the user's request."""
    shadow_timeout_s: float = 600.0
    """A copy to a shadow lane taking longer (queue, head and body) is ended and counted an
    error: stuck copies held every permit, so later ones were all dropped, and the
    comparison never saw the hang."""

    @property
    def hung_deadline_s(self) -> float:
        """The longest a hung replica keeps its place (and its streams) before ejection."""
        return self.probe_interval_s + self.probe_timeout_s


class QueueFullError(Exception):
    def __init__(self, retry_after: int) -> None:
        super().__init__("queue full")
        self.retry_after = retry_after


class QueueTimeoutError(Exception):
    pass


class NoCapacityError(Exception):
    pass


class DeploymentGoneError(Exception):
    """The deployment left the desired set (or, a rollout lane, lost every replica) while
    the request waited for it: it will not be served there."""


class Backend:
    """One replica as the router sees it."""

    def __init__(self, replica: ReplicaStatus, readmit_after: int) -> None:
        host, port = host_port(replica.endpoint or "")
        self.replica_id = replica.replica_id
        self.deployment = replica.deployment
        self.endpoint = replica.endpoint or ""
        self.state = replica.state
        self.pool = UpstreamPool(host, port)
        self.outstanding = 0
        self.health = ReplicaHealth(readmit_after=readmit_after)
        self.models: frozenset[str] = frozenset()
        self.models_at = float("-inf")
        self.in_flight: set[Ticket] = set()

    @property
    def routable(self) -> bool:
        return self.state == "ready" and not self.health.ejected

    @property
    def serving(self) -> bool:
        """Ready or draining and not ejected: it answers probes, scrapes and requests."""
        return self.state in ("ready", "draining") and not self.health.ejected

    def abort_unstarted(self, reason: str) -> None:
        """Abort every exchange on this replica that has not received a byte (they retry)."""
        for ticket in list(self.in_flight):
            ticket.abort(reason)

    def cut_flowing(self, reason: str) -> None:
        """End every response flowing from this replica (its clients get an error event)."""
        for ticket in list(self.in_flight):
            if ticket.started and ticket.cut is not None:
                ticket.cut(reason)


@dataclass(eq=False)
class Ticket:
    """One request's place in the router: what routing needs, and where it went."""

    tier: int
    affinity_key: str | None = None
    adapter: str | None = None
    tried: set[str] = field(default_factory=set)
    future: asyncio.Future[Backend] | None = None
    entry: Waiting[Ticket] | None = None
    started: bool = False
    """Response bytes came from the replica: no retry possible any more."""
    cancel: Abort | None = None
    """Aborts the request's upstream exchange (set while one is in progress)."""
    cut: Abort | None = None
    """Ends the response being relayed (set once its head came): a hung replica's stream."""

    def abort(self, reason: str) -> None:
        """Abort the exchange in progress, unless response bytes already came."""
        if not self.started and self.cancel is not None:
            self.cancel(reason)


def concurrency_limit(spec: DeploymentDesired, config: RouterConfig) -> int:
    """Requests one replica of ``spec`` gets at once: its ``autoscaling.target_concurrency``
    (or the config's override). The autoscaler divides load by this same number."""
    return config.concurrency_override or max(1, round(spec.autoscaling.target_concurrency))


class DeploymentEntry:
    def __init__(self, spec: DeploymentDesired, config: RouterConfig, now: float) -> None:
        self.queue: AdmissionQueue[Ticket] = AdmissionQueue(
            config.queue_max_length, config.queue_max_wait_s, config.tiers
        )
        self.update(spec, config)
        self.backends: dict[str, Backend] = {}
        self.ring: HashRing | None = None
        self.dispatched = 0
        self.drain_rate = 0.0  # dispatches per second, smoothed (for Retry-After)
        self.rate_at = now

    def update(self, spec: DeploymentDesired, config: RouterConfig) -> None:
        self.name = spec.name
        self.model_id = spec.spec.model_id
        self.max_replicas = spec.quota.max
        self.limit = concurrency_limit(spec, config)
        self.serves = spec.serves
        """A rollout lane: the deployment whose requests it takes a share of ("": none)."""
        self.share = spec.traffic_share if spec.serves else 0.0
        self.mirror = bool(spec.serves) and spec.mirror
        """A shadow lane: it gets copies of requests (``share`` of them), never answers."""

    def in_flight(self) -> int:
        return sum(b.outstanding for b in self.backends.values())

    def drain_rate_at(self, now: float) -> float:
        """Dispatches per second, smoothed over about a second (for Retry-After)."""
        elapsed = now - self.rate_at
        if elapsed >= 1.0:
            self.drain_rate = 0.5 * self.drain_rate + 0.5 * self.dispatched / elapsed
            self.dispatched, self.rate_at = 0, now
        return self.drain_rate


@dataclass
class _Outcomes:
    ttft: list[int]
    e2e: list[int]
    requests: int = 0
    errors: int = 0
    dropped: int = 0


def _unit(key: str) -> float:
    """A session key's fixed point in [0, 1) (a lone surrogate in it included: a key is
    request text)."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class ScaleFromZero:
    """Deployments that got a request while they had no ready or starting replica. The
    router adds them; the autoscaler takes them and decides for them at once, not at its
    next tick."""

    def __init__(self) -> None:
        self._names: set[str] = set()
        self._event = asyncio.Event()

    def add(self, deployment: str) -> None:
        self._names.add(deployment)
        self._event.set()

    async def take(self, timeout: float) -> set[str]:
        """The deployments added so far; waits up to ``timeout`` seconds for one if none is."""
        if not self._names:
            self._event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), max(0.0, timeout))
        out, self._names = self._names, set()
        return out


class Router:
    def __init__(self, config: RouterConfig | None = None, clock: Clock = time.monotonic) -> None:
        self.config = config or RouterConfig()
        self.clock = clock
        self.deployments: dict[str, DeploymentEntry] = {}
        self._desired: set[str] = set()
        """The deployments of the last `set_deployments`: one no longer there stays only
        while it still has replicas or queued requests (they finish), then goes."""
        self.backends: dict[str, Backend] = {}
        self.scale_from_zero = ScaleFromZero()
        self._aliases: dict[str, str] = {}
        self._tiebreak = itertools.count()
        self.since = uuid.uuid4().hex
        """Names this router's counters: a restarted router counts from zero again."""
        self._usage: dict[str, list[int]] = {}
        self._lanes: dict[str, list[DeploymentEntry]] = {}
        self._outcomes: dict[str, _Outcomes] = {}
        self._since: dict[str, str] = {}
        """The ``since`` of each name's counters (see ``_prune_counters``)."""
        self._prunes = 0

    # --- feeding -------------------------------------------------------------------------
    def set_deployments(self, deployments: Sequence[DeploymentDesired]) -> None:
        names = {d.name for d in deployments}
        for d in deployments:
            entry = self.deployments.get(d.name)
            if entry is None:
                self.deployments[d.name] = DeploymentEntry(d, self.config, self.clock())
            else:
                entry.update(d, self.config)
        self._desired = names
        self._attach()

    def set_replicas(self, replicas: Sequence[ReplicaStatus]) -> None:
        """Mirror the runtime's list: new replicas join, gone ones leave, states follow."""
        seen = set()
        for r in replicas:
            if r.endpoint is None or r.state == "failed":
                continue
            seen.add(r.replica_id)
            backend = self.backends.get(r.replica_id)
            if backend is None:
                backend = Backend(r, self.config.readmit_after)
                self.backends[r.replica_id] = backend
            backend.state = r.state
            backend.deployment = r.deployment  # a promoted lane's replica changes hands
        for rid in [rid for rid in self.backends if rid not in seen]:
            backend = self.backends.pop(rid)
            backend.abort_unstarted("replica gone")
            backend.pool.close()
        self._attach()

    def replicas_changed(self, replicas: list[ReplicaStatus]) -> None:
        """A runtime's change report (``runtime.base.ReplicaWatcher``): follow it at once."""
        self.set_replicas(replicas)

    def set_models(self, backend: Backend, models: frozenset[str]) -> None:
        """What ``backend``'s ``/v1/models`` lists (adapters become model names)."""
        backend.models, backend.models_at = models, self.clock()
        self._rebuild_aliases()

    def _attach(self) -> None:
        for entry in self.deployments.values():
            mine = {rid: b for rid, b in self.backends.items() if b.deployment == entry.name}
            if mine.keys() != entry.backends.keys():
                entry.backends, entry.ring = mine, None
            if entry.queue and self._closed(entry):
                self._fail_queued(entry)
        for name in [n for n, e in self.deployments.items() if n not in self._desired]:
            if not self.deployments[name].backends:
                del self.deployments[name]  # undesired, and its last replica is gone
        self._prune_counters()
        self._rebuild_aliases()
        lanes: dict[str, list[DeploymentEntry]] = {}
        for entry in sorted(self.deployments.values(), key=lambda e: e.name):
            if entry.serves:
                lanes.setdefault(entry.serves, []).append(entry)
        self._lanes = lanes
        for entry in self.deployments.values():
            self._pump(entry)

    def _closed(self, entry: DeploymentEntry) -> bool:
        """Requests waiting for ``entry`` would wait in vain: it is no longer desired, or it
        is a rollout lane without any replica (its share goes to its deployment)."""
        return entry.name not in self._desired or bool(entry.serves and not entry.backends)

    def _fail_queued(self, entry: DeploymentEntry) -> None:
        """Fail every request waiting for ``entry`` at once (``DeploymentGoneError``; the
        dispatcher moves a lane's to the deployment it serves) rather than at the end of
        ``queue_max_wait_s``."""
        while entry.queue:
            ticket = entry.queue.pop().item
            if ticket.future is not None and not ticket.future.done():
                ticket.future.set_exception(DeploymentGoneError(entry.name))

    def _prune_counters(self) -> None:
        """Drop the counters of names that left ``deployments`` (no longer desired, last
        replica gone): the agent reports only desired ones, so it has read them for the last
        time, and every rollout lane would otherwise add a name for good. A name counted
        again later starts from zero under a new ``since``, which the control plane takes
        for a restarted router (``controlplane.costs.counted``, ``rollouts.outcomes_delta``)."""
        gone = [n for n in self._since if n not in self.deployments]
        for name in gone:
            self._usage.pop(name, None)
            self._outcomes.pop(name, None)
            del self._since[name]
        self._prunes += bool(gone)

    def _since_of(self, name: str) -> str:
        since = self._since.get(name)
        if since is None:
            since = self._since[name] = (
                f"{self.since}.{self._prunes}" if self._prunes else self.since
            )
        return since

    def _rebuild_aliases(self) -> None:
        """Model names → desired deployments only: a deleted deployment (or rolled-back
        lane) kept while its last replicas drain answers no new request (404)."""
        desired = [e for e in self.deployments.values() if e.name in self._desired]
        aliases: dict[str, str] = {}
        for entry in desired:
            for b in entry.backends.values():
                for m in b.models:
                    aliases.setdefault(m, entry.name)
        for entry in desired:
            aliases[entry.name] = entry.name
        self._aliases = aliases

    # --- lookups -------------------------------------------------------------------------
    def resolve(self, model: str) -> DeploymentEntry | None:
        """The deployment a request for ``model`` asks for (a lane is never asked for by
        name: it takes a share of its deployment's requests, see ``lane_for``)."""
        name = self._aliases.get(model)
        entry = self.deployments.get(name) if name is not None else None
        return entry if entry is not None and not entry.serves else None

    def lane_for(self, entry: DeploymentEntry, session_key: str | None) -> DeploymentEntry:
        """Where one request for ``entry`` goes: a rollout lane of it, for that lane's
        ``traffic_share`` of the requests, else ``entry`` itself. Sticky: one session key
        always draws the same point in [0, 1), so a conversation stays on one revision
        while the shares stay put (a larger share keeps the sessions a smaller one had).
        A lane with no ready replica in rotation takes nothing (it is still scaling, or
        its replicas failed): its share goes to the deployment, nothing waits for it."""
        lanes = [e for e in self.lanes_of(entry.name) if self._lane_ready(e)]
        if not lanes:
            return entry
        point = _unit(session_key) if session_key else random.random()
        edge = 0.0
        for lane in lanes:
            edge += lane.share
            if point < edge:
                return lane
        return entry

    def shadows_for(self, entry: DeploymentEntry) -> list[DeploymentEntry]:
        """The shadow lanes that get a copy of some of ``entry``'s requests now."""
        return [e for e in self.lanes_of(entry.name, mirror=True) if self._lane_ready(e)]

    def lanes_of(self, name: str, *, mirror: bool = False) -> list[DeploymentEntry]:
        """The rollout lanes of deployment ``name`` (``mirror``: its shadows instead), by
        name; kept by ``_attach``, so a request does not scan every deployment."""
        return [e for e in self._lanes.get(name, ()) if e.mirror == mirror]

    def _lane_ready(self, lane: DeploymentEntry) -> bool:
        return (
            lane.share > 0
            and lane.name in self._desired
            and any(b.routable for b in lane.backends.values())
        )

    def model_ids(self) -> list[tuple[str, str | None]]:
        """(model id, parent) pairs: deployments and the adapters their replicas serve (not
        rollout lanes: they answer their deployment's name)."""
        out: list[tuple[str, str | None]] = []
        for entry in self.deployments.values():
            if entry.serves or entry.name not in self._desired:
                continue
            out.append((entry.name, None))
            extra = set().union(*[b.models for b in entry.backends.values()]) - {entry.name}
            out += [(m, entry.name) for m in sorted(extra)]
        return out

    def load(self, deployment: str) -> tuple[int, int]:
        """(in flight, queued) of a deployment: the autoscaler's router signals."""
        entry = self.deployments.get(deployment)
        return (entry.in_flight(), len(entry.queue)) if entry is not None else (0, 0)

    def count_usage(
        self,
        deployment: str,
        input_tokens: int,
        output_tokens: int,
        response_bytes: int,
        cross_region: bool = False,
    ) -> None:
        """Add one answer's tokens and bytes to the deployment's counters (counts only:
        never a prompt or a completion is kept); ``cross_region``: a gateway sends it on to
        a client in another region (its bytes are data transfer)."""
        counts = self._usage.get(deployment)
        if counts is None:
            self._since_of(deployment)
            counts = self._usage[deployment] = [0, 0, 0, 0]
        # saturating: a counter at the contract's bound stays there (a report must validate)
        counts[0] = min(counts[0] + max(0, input_tokens), COUNT_MAX)
        counts[1] = min(counts[1] + max(0, output_tokens), COUNT_MAX)
        counts[2] = min(counts[2] + max(0, response_bytes), COUNT_MAX)
        if cross_region:
            counts[3] = min(counts[3] + max(0, response_bytes), COUNT_MAX)

    def _counts_of(self, deployment: str) -> _Outcomes:
        counts = self._outcomes.get(deployment)
        if counts is None:
            width = len(LATENCY_BUCKETS_S) + 1
            self._since_of(deployment)
            counts = self._outcomes[deployment] = _Outcomes([0] * width, [0] * width)
        return counts

    def count_outcome(
        self, deployment: str, error: bool, ttft_s: float | None, e2e_s: float
    ) -> None:
        """One answer of ``deployment`` (or a lane): an error (5xx, or an engine error in
        its stream), its time to first byte and end to end — what a rollout's gates
        compare. Counts only."""
        counts = self._counts_of(deployment)
        counts.requests += 1
        counts.errors += int(error)
        if ttft_s is not None:
            counts.ttft[bisect.bisect_left(LATENCY_BUCKETS_S, ttft_s)] += 1
        counts.e2e[bisect.bisect_left(LATENCY_BUCKETS_S, e2e_s)] += 1

    def count_dropped(self, shadow: str) -> None:
        """One copy for the shadow lane ``shadow`` dropped under pressure (never sent)."""
        self._counts_of(shadow).dropped += 1

    def outcomes(self, deployment: str) -> OutcomeCounters | None:
        """The deployment's outcome counters since this router started (None: no request)."""
        c = self._outcomes.get(deployment)
        if c is None:
            return None
        return OutcomeCounters(
            since=self._since_of(deployment),
            requests=c.requests,
            errors=c.errors,
            ttft_buckets=list(c.ttft),
            e2e_buckets=list(c.e2e),
            dropped=c.dropped,
        )

    def usage(self, deployment: str) -> TokenCounters | None:
        """The deployment's counters since this router started (None: it served nothing)."""
        counts = self._usage.get(deployment)
        if counts is None:
            return None
        return TokenCounters(
            since=self._since_of(deployment),
            input_tokens=counts[0],
            output_tokens=counts[1],
            response_bytes=counts[2],
            cross_region_bytes=counts[3],
        )

    @property
    def fresh(self) -> bool:
        """Whether ``load`` and ``replica_in_flight`` are the router's current counts: always
        in the router's own process (``RemoteRouter``: not while its report is stale)."""
        return True

    def replica_in_flight(self, replica_id: str) -> int | None:
        """Requests on the replica now (0 for one the router does not know); None: unknown
        (``RemoteRouter`` with a stale report), which a drain must not take for 0."""
        backend = self.backends.get(replica_id)
        return backend.outstanding if backend is not None else 0

    def load_report(self) -> dict[str, Any]:
        """The load the agent's autoscaler and drains read when the router runs in its own
        process (``GET /internal/load``; ``remote.RemoteRouter`` is the reader): per
        deployment in flight, queued and ``at_zero`` (requests wait and no replica is ready
        or starting: scale from zero); per replica its in-flight count and its state as the
        router routes it."""
        deployments = {
            name: {
                "in_flight": entry.in_flight(),
                "queued": len(entry.queue),
                "at_zero": bool(entry.queue)
                and not any(b.state in ("ready", "starting") for b in entry.backends.values()),
            }
            for name, entry in self.deployments.items()
        }
        replicas = {
            rid: {"in_flight": b.outstanding, "state": b.state} for rid, b in self.backends.items()
        }
        usage = {name: u.model_dump() for name in self._usage if (u := self.usage(name))}
        outcomes = {name: o.model_dump() for name in self._outcomes if (o := self.outcomes(name))}
        return {
            "deployments": deployments,
            "replicas": replicas,
            "usage": usage,
            "outcomes": outcomes,
        }

    def serving_backends(self) -> list[Backend]:
        """Replicas that answer now (ready or draining, not ejected)."""
        return [b for b in self.backends.values() if b.serving]

    # --- slots ---------------------------------------------------------------------------
    def _choose(self, entry: DeploymentEntry, ticket: Ticket) -> Backend | None:
        routable = [b for b in entry.backends.values() if b.routable]
        if not routable:
            return None
        if entry.ring is None or entry.ring.members != {b.replica_id for b in routable}:
            entry.ring = HashRing(b.replica_id for b in routable)
        candidates = [
            Candidate(b.replica_id, b.outstanding, entry.limit, b.models) for b in routable
        ]
        rid = choose_replica(
            candidates,
            affinity_key=ticket.affinity_key,
            adapter=ticket.adapter,
            ring=entry.ring,
            load_factor=self.config.load_factor,
            exclude=frozenset(ticket.tried),
            tiebreak=next(self._tiebreak),
        )
        if rid is None and ticket.tried:
            # every replica was tried once: allow another round rather than starving
            rid = choose_replica(candidates, adapter=ticket.adapter, tiebreak=next(self._tiebreak))
        return entry.backends[rid] if rid is not None else None

    def _assign(self, entry: DeploymentEntry, backend: Backend, ticket: Ticket) -> Backend:
        backend.outstanding += 1
        backend.in_flight.add(ticket)
        ticket.tried.add(backend.replica_id)
        entry.dispatched += 1
        return backend

    def try_acquire(self, entry: DeploymentEntry, ticket: Ticket) -> Backend | None:
        """A backend with a slot taken, if one is free and nobody is queued ahead."""
        if entry.queue:
            return None
        backend = self._choose(entry, ticket)
        return self._assign(entry, backend, ticket) if backend is not None else None

    async def acquire(
        self,
        entry: DeploymentEntry,
        ticket: Ticket,
        *,
        retry: bool = False,
        wait_s: float | None = None,
    ) -> Backend:
        """A backend with a slot taken for ``ticket``; waits in the queue if none is free,
        at most ``wait_s`` seconds (default ``queue_max_wait_s``; 0 or less: not at all),
        then ``QueueTimeoutError``. ``retry``: the ticket goes back to the head of its tier
        and is never shed. ``DeploymentGoneError`` when ``entry`` is closed (``_closed``),
        now or while the ticket waits."""
        backend = self.try_acquire(entry, ticket)
        if backend is not None:
            return backend
        if self._closed(entry):
            raise DeploymentGoneError(entry.name)
        if entry.max_replicas == 0 and not any(
            b.routable or b.state == "starting" for b in entry.backends.values()
        ):
            raise NoCapacityError(entry.name)
        wait_s = self.config.queue_max_wait_s if wait_s is None else wait_s
        if wait_s <= 0:
            raise QueueTimeoutError(entry.name)
        now = self.clock()
        ticket.future = asyncio.get_running_loop().create_future()
        if retry:
            ticket.entry = entry.queue.requeue(ticket, ticket.tier, now)
        else:
            offer = entry.queue.offer(ticket, ticket.tier, now)
            if not offer.accepted:
                raise QueueFullError(entry.queue.retry_after_s(entry.drain_rate_at(now)))
            ticket.entry = offer.entry
            if not any(b.state in ("ready", "starting") for b in entry.backends.values()):
                self.scale_from_zero.add(entry.name)
            if offer.shed is not None and offer.shed.item.future is not None:
                shed = offer.shed.item.future
                if not shed.done():
                    retry_after = entry.queue.retry_after_s(entry.drain_rate_at(now))
                    shed.set_exception(QueueFullError(retry_after))
        self._pump(entry)
        try:
            return await asyncio.wait_for(asyncio.shield(ticket.future), wait_s)
        except TimeoutError:
            if ticket.entry is not None and entry.queue.remove(ticket.entry):
                raise QueueTimeoutError(entry.name) from None
            return await ticket.future  # dispatched in the same instant
        except asyncio.CancelledError:
            if ticket.entry is not None:
                entry.queue.remove(ticket.entry)
            future = ticket.future
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(future.result(), ticket)
            raise

    def _pump(self, entry: DeploymentEntry) -> None:
        while entry.queue:
            head = entry.queue.peek()
            assert head is not None
            ticket = head.item
            if ticket.future is None or ticket.future.done():
                entry.queue.pop()
                continue
            backend = self._choose(entry, ticket)
            if backend is None:
                return
            entry.queue.pop()
            ticket.future.set_result(self._assign(entry, backend, ticket))

    def release(self, backend: Backend, ticket: Ticket) -> None:
        if ticket in backend.in_flight:
            backend.in_flight.discard(ticket)
            backend.outstanding -= 1
        entry = self.deployments.get(backend.deployment)
        if entry is not None:
            self._pump(entry)

    # --- health ---------------------------------------------------------------------------
    def eject(self, backend: Backend, reason: str, *, hung: bool = False) -> bool:
        """Stop routing to ``backend``; its requests that got no byte yet are aborted (their
        dispatcher retries them). ``hung``: it stopped answering its health probe, so the
        streams flowing from it end too (within ``hung_deadline_s``, not when the client
        gives up). True if it was routable until now."""
        if hung:
            backend.cut_flowing(
                f"replica {backend.replica_id} stopped answering (hung or dead): {reason}"
            )
        if not backend.health.failed(self.clock(), reason):
            return False
        log.warning("replica %s ejected: %s", backend.replica_id, reason)
        backend.abort_unstarted(f"replica {backend.replica_id} ejected: {reason}")
        return True

    def probe_ok(self, backend: Backend) -> None:
        """A good probe: after enough of them an ejected replica takes requests again."""
        if backend.health.probe_ok():
            log.info("replica %s readmitted", backend.replica_id)
            entry = self.deployments.get(backend.deployment)
            if entry is not None:
                self._pump(entry)

    def close(self) -> None:
        for backend in self.backends.values():
            backend.pool.close()

"""The router in a process of its own follows the plane from the agent's state directory.

Two files, both written by the agent's side and only read here: the runtime's record of
replicas (``runtime/replicas.json``, rewritten on every replica change, renamed into place)
and the desired-state slots (``desired-state.0/1``, the last snapshot: deployments and their
policies). Their ``stat`` is checked every ``interval_s`` (100 ms: a few µs per check); a
change is read, and read once more one interval later, so that a slot being written during
the first read is seen whole in the second. Nothing here needs the agent to run: after an
agent crash the files hold what was true, and the replicas keep running (static stability).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from controlplane.contracts import DeploymentDesired
from workloadplane.router.core import Router
from workloadplane.runtime.process import read_replicas
from workloadplane.state import KEPT_FILE, SLOT_FILES, STATE_FILE, DesiredStateStore, load_kept

log = logging.getLogger(__name__)

Stamp = tuple[tuple[int, int, int] | None, ...]


def _stamp(paths: list[Path]) -> Stamp:
    out: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            out.append(None)
        else:
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


class PlaneFollower:
    """Feeds ``router`` from ``state_dir`` (the agent's ``--state-dir``)."""

    def __init__(self, router: Router, state_dir: Path, *, interval_s: float = 0.1) -> None:
        self.router = router
        self.state_dir = Path(state_dir)
        self.interval_s = interval_s
        self._runtime = self.state_dir / "runtime"
        self._replica_files = [self._runtime / "replicas.json"]
        self._desired_files = [self.state_dir / n for n in (*SLOT_FILES, STATE_FILE, KEPT_FILE)]
        self._store = DesiredStateStore(self.state_dir, fsync=False)  # read only: load()
        self._stamps: dict[str, Stamp] = {}
        self._again: set[str] = set()
        self.generation: int | None = None
        """The desired generation the router follows (None before any snapshot)."""
        self.version: tuple[int, int] | None = None
        """... and its (epoch, generation)."""
        self.kept: list[DeploymentDesired] = []
        """Deployments the agent keeps through their disappearance grace (``KEPT_FILE``)."""

    def poll(self) -> None:
        """Read what changed since the last poll (and what changed the poll before)."""
        if self._changed("desired", self._desired_files):
            state = self._store.load()
            kept = load_kept(self.state_dir)
            # the version, not the generation: a new epoch (a control plane restored
            # behind the plane) may issue the generation this router already follows;
            # and the deployments the agent keeps through their disappearance grace
            if state is not None and (state.version, kept) != (self.version, self.kept):
                self.generation, self.version, self.kept = state.generation, state.version, kept
                names = {d.name for d in state.deployments}
                extra = [d for d in kept if d.name not in names]
                self.router.set_deployments([*state.deployments, *extra])
                log.info("following desired state %s (%d kept)", state.version, len(extra))
        if self._changed("replicas", self._replica_files):
            self.router.set_replicas(read_replicas(self._runtime))

    def _changed(self, what: str, paths: list[Path]) -> bool:
        stamp = _stamp(paths)
        if stamp != self._stamps.get(what):
            self._stamps[what] = stamp
            self._again.add(what)
            return True
        if what in self._again:
            self._again.discard(what)
            return True
        return False

    async def run(self) -> None:
        while True:
            try:
                self.poll()
            except Exception:  # a bad file must not stop the data path
                log.exception("reading the plane's state in %s failed; retrying", self.state_dir)
            await asyncio.sleep(self.interval_s)

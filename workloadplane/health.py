"""Pure ejection bookkeeping for one replica, as the router sees it.

A replica is ejected at once when a probe or a request fails (connection refused or reset,
no answer within the deadline, a 5xx from /health): serving nothing is cheaper than serving
into a hung engine. It is admitted again after ``readmit_after`` consecutive good probes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ReplicaHealth:
    readmit_after: int = 2
    ejected: bool = False
    ejected_at: float | None = None
    reason: str = ""
    good_probes: int = 0
    ejections: int = 0

    def failed(self, now: float, reason: str) -> bool:
        """Record a failed probe or request; True if this ejects the replica now."""
        self.good_probes = 0
        if self.ejected:
            return False
        self.ejected, self.ejected_at, self.reason = True, now, reason
        self.ejections += 1
        return True

    def probe_ok(self) -> bool:
        """Record a good probe; True if this readmits an ejected replica."""
        if not self.ejected:
            return False
        self.good_probes += 1
        if self.good_probes >= self.readmit_after:
            self.ejected, self.ejected_at, self.reason, self.good_probes = False, None, "", 0
            return True
        return False

"""The demand a plane reports upward, with the local autoscaler's hysteresis.

Pure: the autoscaler's demand and ``now`` in, the value to report out. A rise is reported
at once (placement must find the room); a fall only once the demand has stayed lower for
the scale-down delay, and then to the highest demand seen meanwhile — the same rule the
local policy applies before it removes a replica. So a load hovering across an integer
number of replicas does not make placement add and remove a replica on every heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReportedDemand:
    """``value``: what is reported (None before the first decision). ``lower_since``: POSIX
    time the demand first fell below it; ``lower_peak``: the highest demand since then."""

    value: int | None = None
    lower_since: float | None = None
    lower_peak: int = 0


def reported_demand(
    previous: ReportedDemand, demand: int, now: float, delay_seconds: float
) -> ReportedDemand:
    """The next report for ``demand`` at ``now``: up at once, down after ``delay_seconds``."""
    if previous.value is None or demand >= previous.value:
        return ReportedDemand(demand)
    if previous.lower_since is None:
        since, peak = now, demand
    else:
        since, peak = previous.lower_since, max(previous.lower_peak, demand)
    if now - since >= delay_seconds:
        return ReportedDemand(peak)
    return ReportedDemand(previous.value, since, peak)

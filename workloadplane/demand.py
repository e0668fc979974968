"""The demand a plane reports upward, with the local autoscaler's hysteresis.

Pure: the autoscaler's demand and ``now`` in, the value to report out. A rise of two
replicas or more, or any rise in panic, is reported at once (placement must find the room);
a rise of one replica once it has held for the window (a load hovering across an integer
moves the demand by one and back); a fall only once the demand has stayed lower for the
scale-down delay, and then to the highest demand seen meanwhile — the rule the local policy
applies before it removes a replica. So a steady load does not make placement add and
remove a replica on every heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReportedDemand:
    """``value``: what is reported (None before the first decision). ``lower_since``: POSIX
    time the demand first fell below it; ``lower_peak``: the highest demand since then.
    ``higher_since``: time it first rose one above it (without falling back since)."""

    value: int | None = None
    lower_since: float | None = None
    lower_peak: int = 0
    higher_since: float | None = None


def reported_demand(
    previous: ReportedDemand,
    demand: int,
    now: float,
    delay_seconds: float,
    window_seconds: float = 0.0,
    urgent: bool = False,
) -> ReportedDemand:
    """The next report for ``demand`` at ``now``: up by 2+ (or ``urgent``: panic) at once, up
    by one after ``window_seconds``, down after ``delay_seconds``."""
    if previous.value is None or demand == previous.value:
        return ReportedDemand(demand)
    if demand > previous.value:
        if urgent or demand >= previous.value + 2:
            return ReportedDemand(demand)
        since = previous.higher_since if previous.higher_since is not None else now
        if now - since >= window_seconds:
            return ReportedDemand(demand)
        return ReportedDemand(previous.value, higher_since=since)
    if previous.lower_since is None:
        since, peak = now, demand
    else:
        since, peak = previous.lower_since, max(previous.lower_peak, demand)
    if now - since >= delay_seconds:
        return ReportedDemand(peak)
    return ReportedDemand(previous.value, since, peak)

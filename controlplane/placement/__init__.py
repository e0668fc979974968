"""Placement engine: cost-optimal, explainable bin-packing of replicas onto GPU pools.

Pure: no I/O, no clock, no randomness; imports nothing of the project but itself. Call
`place(PlacementInput)` for a full re-plan against `current`, or `replan(previous, input)`
for an incremental one that touches only changed deployments. See docs/placement.md.
"""

from controlplane.placement.constraints import PlacementInputError
from controlplane.placement.engine import place, replan
from controlplane.placement.model import (
    Assignment,
    Change,
    Cluster,
    CostWeights,
    Deployment,
    PlacementInput,
    PlacementPolicy,
    PlacementResult,
    Pool,
    Procurement,
    Region,
    Unplaced,
)

__all__ = [
    "Assignment",
    "Change",
    "Cluster",
    "CostWeights",
    "Deployment",
    "PlacementInput",
    "PlacementInputError",
    "PlacementPolicy",
    "PlacementResult",
    "Pool",
    "Procurement",
    "Region",
    "Unplaced",
    "place",
    "replan",
]

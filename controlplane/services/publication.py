"""What the bus process reports back about publishing desired state: a snapshot too large
to send (an event once per episode, and one when it fits again), and a generation the
bucket holds that PostgreSQL does not know (a deleted cluster's empty snapshot)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.db.models import Cluster, Event


def record_too_large(
    session: Session,
    cluster_name: str,
    generation: int,
    size: int,
    limit: int,
    biggest: list[tuple[str, int]],
) -> None:
    """`DesiredStateTooLarge` on the cluster: its snapshot was not sent (the bus process
    records it once per episode; every other cluster keeps flowing)."""
    cluster = session.scalars(select(Cluster).where(Cluster.name == cluster_name)).first()
    heavy = ", ".join(f"{name} ({n} bytes)" for name, n in biggest) or "none"
    session.add(
        Event(
            type="DesiredStateTooLarge",
            object_kind="Cluster",
            object_id=cluster.id if cluster else None,
            object_name=cluster_name,
            message=f"desired state of {cluster_name} (generation {generation}) is {size} "
            f"bytes, above the NATS server's max_payload of {limit} bytes: not sent, its "
            f"agent keeps the last snapshot it has. Biggest deployments: {heavy}. Shrink "
            "their engine_args, move some deployments to another cluster, or raise "
            "max_payload in the NATS server's config",
            data={
                "generation": generation,
                "size_bytes": size,
                "limit_bytes": limit,
                "biggest": [{"deployment": name, "bytes": n} for name, n in biggest],
            },
        )
    )


def record_sent_again(session: Session, cluster_name: str, generation: int, size: int) -> None:
    """`DesiredStateSent`: a cluster whose snapshot was too large gets snapshots again."""
    cluster = session.scalars(select(Cluster).where(Cluster.name == cluster_name)).first()
    session.add(
        Event(
            type="DesiredStateSent",
            object_kind="Cluster",
            object_id=cluster.id if cluster else None,
            object_name=cluster_name,
            message=f"desired state of {cluster_name} fits again ({size} bytes): "
            f"generation {generation} sent",
            data={"generation": generation, "size_bytes": size},
        )
    )

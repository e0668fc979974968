"""What a desired-state generation handed a cluster is worked out once per (epoch,
generation), not at every heartbeat (it was half the cost of recording one): a new
generation or a new epoch at the same generation works it out again."""

from __future__ import annotations

from types import SimpleNamespace


def test_what_a_cluster_was_handed_is_worked_out_once_per_epoch_and_generation(monkeypatch):
    from controlplane.services import observed

    worked: list[tuple[int, int]] = []

    def handed(session, cluster):
        worked.append((cluster.desired_epoch, cluster.desired_generation))
        return observed.Handed(served={}, instances=frozenset(), retired=frozenset())

    monkeypatch.setattr(observed, "handed", handed)
    cache = observed.HandedCache(most=2)
    for epoch, generation in [(1, 5), (1, 5), (1, 6), (2, 6), (2, 6), (1, 6)]:
        cache(None, SimpleNamespace(id="c1", desired_epoch=epoch, desired_generation=generation))  # type: ignore[arg-type]
    assert worked == [(1, 5), (1, 6), (2, 6), (1, 6)]
    for name in ("c2", "c3"):  # past ``most`` clusters it starts afresh
        cache(None, SimpleNamespace(id=name, desired_epoch=1, desired_generation=1))  # type: ignore[arg-type]
    cache(None, SimpleNamespace(id="c1", desired_epoch=1, desired_generation=6))  # type: ignore[arg-type]
    assert worked[-1] == (1, 6) and len(worked) == 7

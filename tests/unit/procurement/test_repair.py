"""The reconcile sweep's decision: our instance rows against the provider's own list, one
scenario per row of `core.repair`'s table, then invariants."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controlplane.procurement.core import Adopt, Policy, Repairs, repair

from .builders import NOW, listed_for, make_row

POLICY = Policy(stale_request_s=300, gone_grace_s=60)


def repaired(rows, listed) -> Repairs:
    return repair(rows, listed, NOW, POLICY)


def test_rows_that_agree_with_the_provider_need_nothing():
    rows = [make_row("running", 3600), make_row("draining", 10), make_row("requested", 10)]
    assert repaired(rows, listed_for(*rows[:2])) == Repairs()


def test_a_request_the_provider_already_made_is_adopted():
    row = make_row("requested", 5)  # the worker died between the call and the record
    (made,) = listed_for(row)
    assert repaired([row], [made]).adopt == (Adopt(row.id, made.id),)


def test_a_stale_request_is_resumed_with_its_own_key_and_a_fresh_one_waits():
    stale, fresh = make_row("requested", 300), make_row("requested", 299)
    other = make_row("requested", 900, pool="q")
    todo = repaired([stale, fresh, other], [])
    assert todo.resume == {
        "p": ((stale.id, stale.idempotency_key),),
        "q": ((other.id, other.idempotency_key),),
    }
    assert todo.adopt == () and todo.gone == ()


def test_a_running_instance_missing_from_the_list_is_gone_after_the_grace():
    young, old = make_row("running", 59), make_row("running", 60)
    assert repaired([young, old], []).gone == (old.id,)


def test_a_draining_instance_missing_from_the_list_is_gone_at_once():
    row = make_row("draining", 0)  # the provider took it back at its deadline
    assert repaired([row], []).gone == (row.id,)


def test_a_stuck_release_is_run_again():
    stuck, recent = make_row("releasing", 300), make_row("releasing", 10)
    assert repaired([stuck, recent], listed_for(stuck, recent)).release == (stuck.id,)


def test_an_instance_launched_for_a_key_we_gave_up_is_an_orphan():
    rows = [make_row(state) for state in ("failed", "released", "gone")]
    listed = listed_for(*rows, key_only=True)
    assert repaired(rows, listed).orphans == tuple(i.id for i in listed)
    assert repaired(rows, []).orphans == ()


STATES = ["requested", "running", "draining", "releasing", "failed", "released", "gone"]


@given(
    st.lists(
        st.tuples(st.sampled_from(STATES), st.integers(0, 1000), st.booleans()),
        max_size=12,
    )
)
def test_invariants(spec):
    rows = [make_row(state, age) for state, age, _ in spec]
    listed = listed_for(*(r for r, (_, _, shown) in zip(rows, spec, strict=True) if shown))
    todo = repaired(rows, listed)
    touched = [a.row_id for a in todo.adopt] + list(todo.gone) + list(todo.release)
    touched += [row_id for todo_ in todo.resume.values() for row_id, _ in todo_]
    assert len(touched) == len(set(touched))  # one repair per row at most
    listed_ids = {i.id for i in listed}
    by_id = {r.id: r for r in rows}
    assert all(by_id[r].provider_instance_id not in listed_ids for r in todo.gone)
    live = {r.provider_instance_id for r in rows if r.state in ("running", "draining")}
    assert not live & set(todo.orphans)  # an instance we still hold is never deleted
    assert all(by_id[a.row_id].state == "requested" for a in todo.adopt)


def test_an_instance_the_provider_stopped_is_gone_and_deleted():
    """GCE's TERMINATED (stopped after a host event) was left out of the list: its row went
    gone after the grace, a replacement was bought, and the stopped one billed for its disks
    for ever."""
    from dataclasses import replace

    from providers.base import InstanceState

    row = make_row("running", 10)
    (listed,) = listed_for(row)
    todo = repaired([row], [replace(listed, state=InstanceState.STOPPED)])
    assert todo.gone == (row.id,) and todo.orphans == (listed.id,)
    assert repaired([row], [listed]) == Repairs()  # running: nothing to do


def test_gce_lists_a_stopped_instance_as_stopped():
    from providers import gcp
    from providers.base import InstanceState

    assert gcp._STATES["TERMINATED"] is InstanceState.STOPPED

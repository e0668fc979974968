"""The reports stream is bounded on disk: a plane publishing in a loop on its own subjects
(all its credentials allow) pushes out the oldest reports, it does not fill the control
plane's disk; a stream made before the bound gets it. Real NATS JetStream."""

from __future__ import annotations

import pytest
from nats.js.api import DiscardPolicy, StreamConfig

from controlplane.bus import streams
from controlplane.contracts import (
    FACT_TYPE_NAMES,
    REPORTS_STREAM,
    REPORTS_SUBJECTS,
    fact_subject,
    observed_subject,
)
from tests.integration.bus.conftest import SETUP_S, Bus

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_a_flooding_plane_fills_only_the_streams_bound(bus: Bus, monkeypatch):
    info = await bus.js.stream_info(REPORTS_STREAM)
    assert info.config.max_bytes == streams.REPORTS_MAX_BYTES
    assert info.config.discard == DiscardPolicy.OLD

    monkeypatch.setattr(streams, "REPORTS_MAX_BYTES", 64 * 1024)
    await streams.ensure_reports_stream(
        bus.nc.jetstream(timeout=SETUP_S)
    )  # the bound changed: the stream follows
    plane = await bus.connect(bus.clusters["a"], bus.errors)
    try:
        pjs = plane.jetstream(timeout=2.0)
        kinds = [observed_subject("a")] + [fact_subject("a", t) for t in FACT_TYPE_NAMES]
        for i in range(300):  # ~300 KiB over every subject the plane may publish on
            await pjs.publish(kinds[i % len(kinds)], b"x" * 1024)
        await pjs.publish(fact_subject("a", "replica_started"), b"newest")
    finally:
        await plane.close()
    info = await bus.js.stream_info(REPORTS_STREAM)
    assert info.state.bytes <= 64 * 1024
    newest = await bus.js.get_last_msg(REPORTS_STREAM, fact_subject("a", "replica_started"))
    assert newest.data == b"newest"  # the oldest went, not what came last


async def test_a_stream_made_before_the_bound_gets_it(bus: Bus):
    await bus.js.delete_stream(REPORTS_STREAM)
    await bus.js.add_stream(StreamConfig(name=REPORTS_STREAM, subjects=list(REPORTS_SUBJECTS)))
    await streams.ensure_reports_stream(bus.nc.jetstream(timeout=SETUP_S))
    info = await bus.js.stream_info(REPORTS_STREAM)
    assert info.config.max_bytes == streams.REPORTS_MAX_BYTES


async def test_a_plane_looping_on_one_subject_pushes_out_only_its_own_reports(
    bus: Bus, monkeypatch
):
    """With only the stream's bytes bounded, a plane looping on heartbeats pushed out other
    planes' unconsumed facts (a spot notice) once the stream was full."""
    monkeypatch.setattr(streams, "REPORTS_PER_SUBJECT", 50)
    await streams.ensure_reports_stream(bus.nc.jetstream(timeout=SETUP_S))
    info = await bus.js.stream_info(REPORTS_STREAM)
    assert info.config.max_msgs_per_subject == 50
    other = await bus.connect(bus.clusters["b"], bus.errors)
    plane = await bus.connect(bus.clusters["a"], bus.errors)
    try:
        notice = fact_subject("b", "spot_interruption_noticed")
        await other.jetstream(timeout=2.0).publish(notice, b"b's notice")
        pjs = plane.jetstream(timeout=2.0)
        for i in range(200):
            await pjs.publish(observed_subject("a"), b"beat %d" % i)
    finally:
        await plane.close()
        await other.close()
    info = await bus.js.stream_info(REPORTS_STREAM)
    assert info.state.messages == 51  # a's newest 50 heartbeats and b's notice
    assert (await bus.js.get_last_msg(REPORTS_STREAM, notice)).data == b"b's notice"
    newest = await bus.js.get_last_msg(REPORTS_STREAM, observed_subject("a"))
    assert newest.data == b"beat 199"

"""The webhook export's counts as Prometheus series, read from PostgreSQL at each scrape
(the worker that sends keeps them in `webhook_cursors`, so they survive its restarts and
every API worker answers the same). Listed in docs/logging.md."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from controlplane.webhook import store

log = logging.getLogger(__name__)


class WebhookCollector(Collector):
    def __init__(self, read_session: Callable[[], Session]) -> None:
        self.read_session = read_session

    def describe(self) -> list[Metric]:
        return []  # no query at registration

    def collect(self) -> Iterator[Metric]:
        try:
            with self.read_session() as session:
                streams = store.counts(session)
        except SQLAlchemyError as exc:
            log.warning("webhook metrics: the database did not answer (%s)", type(exc).__name__)
            return
        delivered = CounterMetricFamily(
            "gpufleet_webhook_delivered", "Alerts the webhook accepted (2xx)", labels=["stream"]
        )
        failed = CounterMetricFamily(
            "gpufleet_webhook_failed_attempts",
            "Payloads the webhook did not accept (no answer, 5xx, 4xx); retried",
            labels=["stream"],
        )
        dead = CounterMetricFamily(
            "gpufleet_webhook_dead_letters",
            "Alerts skipped after the webhook refused their batch too many times",
            labels=["stream"],
        )
        failing = GaugeMetricFamily(
            "gpufleet_webhook_consecutive_failures",
            "Failed tries in a row of the batch waiting to be sent (0: delivering)",
            labels=["stream"],
        )
        for s in streams:
            delivered.add_metric([s.stream], s.delivered)
            failed.add_metric([s.stream], s.failed_attempts)
            dead.add_metric([s.stream], s.dead_letters)
            failing.add_metric([s.stream], s.failures_in_a_row)
        yield from (delivered, failed, dead, failing)

"""A schemathesis run over the whole OpenAPI document against the API on real PostgreSQL.

Every operation gets a fixed number of valid and invalid requests (derandomised, so a run is
repeatable), sent with an admin token to a fleet with one of everything. The API must never
answer 5xx, and every status code, content type and body it sends must be the one the
document declares: a client generated from the document can then trust it.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.integration.api import builders as b

DEFAULT_EXAMPLES = 15  # per operation and generation mode (valid, invalid): ~1,700 requests
EXAMPLES_PER_OPERATION = int(os.environ.get("GPUFLEET_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))
"""GPUFLEET_FUZZ_EXAMPLES=200 runs a deeper search by hand (without the time ceiling)."""
BUDGET_S = 150  # a ceiling for a loaded machine; the run takes 35-60 s on 2 shared cores
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def _fuzz(operation: Any, mode: GenerationMode, headers: dict[str, str]) -> list[str]:
    """Send the operation's examples in `mode`; each failed check, one line per distinct one."""
    failures: dict[str, str] = {}

    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
        ],
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def send(case: Any) -> None:
        try:
            case.call_and_validate(headers=headers, checks=CHECKS)
        except (FailureGroup, Failure) as exc:  # collect all, shrink none: the run is bounded
            found = exc.exceptions if isinstance(exc, FailureGroup) else (exc,)
            for failure in found:
                key = f"{operation.label} [{mode.value}]: {failure.title}"
                detail = failure.message.strip().replace("\n", " ")[:400]
                failures.setdefault(key, f"{key}: {detail}\n  {case.as_curl_command()}")

    try:
        send()
    except Unsatisfiable:  # nothing to make invalid (e.g. no parameters, no body)
        assert mode is GenerationMode.NEGATIVE, f"{operation.label}: no valid request to send"
    return list(failures.values())


@pytest.mark.timeout(BUDGET_S + 60 if EXAMPLES_PER_OPERATION <= DEFAULT_EXAMPLES else 0)
def test_the_api_answers_every_generated_request_as_documented(app_client, admin, tokens):
    b.seed(admin)  # so that some generated names hit real objects
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app_client.app)
    headers = {"Authorization": f"Bearer {tokens['admin']}"}
    started = time.monotonic()
    failures: list[str] = []
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), (
            f"the document has an operation schemathesis cannot read: {result.err()}"
        )
        operations.append(result.ok())
    assert len(operations) > 50, "the document lost operations: the run would prove little"
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            failures += _fuzz(operation, mode, headers)
    elapsed = time.monotonic() - started
    assert failures == [], f"{len(failures)} distinct failures:\n\n" + "\n\n".join(failures)
    deeper = EXAMPLES_PER_OPERATION > DEFAULT_EXAMPLES
    assert deeper or elapsed < BUDGET_S, (
        f"the run took {elapsed:.0f} s; lower EXAMPLES_PER_OPERATION"
    )

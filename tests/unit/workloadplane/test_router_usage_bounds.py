"""An engine's usage is the tenant's (its image is): a claim of 2⁶³ tokens overflowed the
router's counters, after which every heartbeat of the plane failed to validate and was never
sent — the control plane took the whole plane for dead."""

from __future__ import annotations

from controlplane.contracts import COUNT_MAX, TokenCounters
from workloadplane.router.app import _PROMPT, _USAGE
from workloadplane.router.core import Router


def test_a_usage_claim_too_long_to_be_true_counts_as_none():
    huge = b'{"usage": {"prompt_tokens": 9223372036854775808, "completion_tokens": 1' + b"0" * 5000
    assert _USAGE.search(huge + b"}}") is None
    assert _PROMPT.search(huge) is None
    match = _USAGE.search(b'{"usage": {"prompt_tokens": 7, "completion_tokens": 123456789}}')
    assert match is not None and int(match.group(1)) == 123456789


def test_counters_saturate_at_the_contracts_bound_and_still_make_a_report():
    router = Router()
    for _ in range(3):
        router.count_usage("chat", 2**62, 2**62, 2**62, cross_region=True)
    usage = router.usage("chat")
    assert usage is not None
    assert usage.input_tokens == usage.output_tokens == usage.response_bytes == COUNT_MAX
    assert usage.cross_region_bytes == COUNT_MAX
    TokenCounters.model_validate(usage.model_dump())  # what the heartbeat sends validates

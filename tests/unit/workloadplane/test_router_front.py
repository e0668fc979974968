"""The OpenAI front the router and the gateway share reads whatever headers a client sends:
an X-Priority that names no tier is ignored, never a 500."""

from __future__ import annotations

from workloadplane.router.front import choose_tier, parse_tier


def test_a_priority_is_a_tier_name_or_a_small_number_and_anything_else_is_ignored():
    assert [parse_tier(v) for v in (b"high", b" LOW ", b"normal", b"2", b"007")] == [0, 2, 1, 2, 7]
    # "²" is a digit to str.isdigit but not to int(); 5,000 digits are past int()'s limit
    for odd in ("²".encode(), "٣".encode(), b"9" * 5000, b"-1", b"1e3", b"\xff", b""):
        assert parse_tier(odd) is None, odd
    assert choose_tier(None, 1, "²".encode(), 3) == 1  # the default tier, as without one
    assert choose_tier(0, 1, b"99", 3) == 2  # a number past the tiers: the least urgent

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


def test_internal_load_is_for_clients_on_the_routers_own_host():
    from workloadplane.router.app import same_host

    def scope(client, server=("10.0.0.5", 8080)):
        return {"client": client, "server": server}

    for client in (("127.0.0.1", 5), ("127.8.9.1", 5), ("::1", 5), ("::ffff:127.0.0.1", 5),
                   ("10.0.0.5", 5)):  # fmt: skip
        assert same_host(scope(client)), client
    for client in (("10.0.0.6", 5), ("::ffff:10.0.0.6", 5), ("not an address", 5), None):
        assert not same_host(scope(client)), client
    assert not same_host({"client": ("10.0.0.5", 5), "server": None})
    assert not same_host({})  # a server that does not say who is asking

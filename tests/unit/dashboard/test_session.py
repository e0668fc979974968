"""Dashboard sessions: the CSRF value, the login redirect target, form numbers (pure)."""

from __future__ import annotations

import pytest

from controlplane.dashboard.actions import _safe_next
from controlplane.dashboard.session import csrf_for, integer
from controlplane.errors import BadRequest


def test_the_csrf_value_is_bound_to_the_session_and_reveals_nothing_of_it():
    a, b = csrf_for("session-one"), csrf_for("session-two")
    assert a != b and csrf_for("session-one") == a
    assert "session-one" not in a and len(a) == 64


@pytest.mark.parametrize(
    ("asked", "goes"),
    [
        ("/pools", "/pools"),
        ("/events?log=audit", "/events?log=audit"),
        ("//evil.example/", "/"),
        ("https://evil.example/", "/"),
        ("/\\evil.example", "/"),
        (None, "/"),
    ],
)
def test_after_login_only_a_local_path_is_followed(asked, goes):
    assert _safe_next(asked) == goes


def test_form_numbers_are_bounded_whole_numbers():
    assert integer({"n": " 7 "}, "n", 0, 10) == 7
    for bad in ("", "x", "3.5", "11", "-1"):
        with pytest.raises(BadRequest, match="whole number from 0 to 10"):
            integer({"n": bad}, "n", 0, 10)

"""GPUFLEET_SENTRY_DSN: off without it, one clear warning without the package, and with it
an SDK started without personal data (a fake sentry_sdk module stands in for the SDK)."""

from __future__ import annotations

import json
import sys
from types import ModuleType
from typing import Any

import pytest

from gpufleet_logging import request_id_bound
from gpufleet_logging.sentry import configure_sentry, scrub
from tests.unit.logs.conftest import Configure, lines


class FakeSdk(ModuleType):
    def __init__(self) -> None:
        super().__init__("sentry_sdk")
        self.options: dict[str, Any] = {}
        self.tags: dict[str, str] = {}

    def init(self, **options: Any) -> None:
        self.options = options

    def set_tag(self, key: str, value: str) -> None:
        self.tags[key] = value


def _absent(name: str) -> ModuleType:
    raise ModuleNotFoundError(f"No module named {name!r}")


def test_no_dsn_no_sentry() -> None:
    sdk = FakeSdk()
    assert configure_sentry("api", None, load=lambda _: sdk) == "off"
    assert sdk.options == {}


def test_a_dsn_starts_the_sdk_without_personal_data() -> None:
    sdk = FakeSdk()
    assert configure_sentry("router", "https://k@o1.ingest.example/1", load=lambda _: sdk) == "on"
    assert sdk.options["dsn"] == "https://k@o1.ingest.example/1"
    assert sdk.options["send_default_pii"] is False
    assert sdk.options["include_local_variables"] is False
    assert sdk.options["max_request_body_size"] == "never"
    assert sdk.options["before_send"] is scrub
    assert sdk.tags == {"process": "router"}


def test_a_dsn_without_the_package_says_so_once(configured: Configure, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setitem(sys.modules, "sentry_sdk", None)  # type: ignore[arg-type]  # import fails
    out = configured("worker", GPUFLEET_SENTRY_DSN="https://k@o1.ingest.example/1")
    said = [line["message"] for line in lines(out)]
    assert len(said) == 1 and "sentry-sdk" in said[0] and "pip install" in said[0], said
    assert "https://k@" not in out.getvalue()  # the DSN holds a key: never echoed
    assert configure_sentry("worker", "https://x", load=_absent) == "missing"


def test_scrub_strips_bodies_credentials_and_frame_variables() -> None:
    event: dict[str, Any] = {
        "request": {
            "url": "http://127.0.0.1:8100/v1/chat/completions",
            "data": '{"messages": [{"content": "my secret prompt"}]}',
            "cookies": {"session": "s"},
            "query_string": "key=k",
            "headers": {"Authorization": "Bearer k", "Content-Type": "application/json"},
        },
        "exception": {
            "values": [
                {
                    "stacktrace": {
                        "frames": [{"function": "f", "vars": {"body": "my secret prompt"}}]
                    }
                }
            ]
        },
    }
    with request_id_bound("req-9"):
        out = scrub(event)
    assert "my secret prompt" not in repr(out) and "Bearer" not in repr(out)
    assert out["request"]["headers"] == {"Content-Type": "application/json"}
    assert out["request"]["url"].endswith("/v1/chat/completions")
    assert out["tags"] == {"request_id": "req-9"}


def test_scrub_keeps_no_breadcrumb_text() -> None:
    """Breadcrumbs carry earlier log lines and every HTTP call's URL: the events webhook's
    (a Slack URL's path is its secret) went to Sentry with the next error."""
    url = "https://hooks.slack.com/services/T/B/S3CRET"
    crumbs = [
        {"category": "httplib", "type": "http", "level": "info", "data": {"url": url}},
        {"category": "gpufleet.worker", "level": "info", "message": f"posted to {url}"},
    ]
    for shape in ({"values": crumbs}, crumbs):
        out = scrub({"breadcrumbs": json.loads(json.dumps(shape))})
        assert "S3CRET" not in json.dumps(out)
        assert [c["category"] for c in out["breadcrumbs"]["values"]] == [
            "httplib",
            "gpufleet.worker",
        ]

"""configure_logging: JSON lines with the request id, text for eyes, bounded lines, settings
that are not understood fall back with a warning, servers' loggers adopted."""

from __future__ import annotations

import logging

from gpufleet_logging import clean_request_id, current_request_id, request_id_bound
from gpufleet_logging.formats import MAX_FIELD, MAX_MESSAGE, MAX_TRACEBACK
from tests.unit.logs.conftest import Configure, lines

log = logging.getLogger("gpufleet.test")


def test_a_line_is_one_json_object_with_the_bound_request_id(configured: Configure) -> None:
    out = configured("router")
    with request_id_bound("req-7"):
        log.warning("replica %s ejected", "r1", extra={"replica": "r1", "tries": 3})
    log.warning("no request now")
    first, second = lines(out)
    assert first["message"] == "replica r1 ejected"
    assert first["level"] == "WARNING" and first["logger"] == "gpufleet.test"
    assert first["process"] == "router" and isinstance(first["pid"], int)
    assert first["request_id"] == "req-7"
    assert first["replica"] == "r1" and first["tries"] == 3
    assert first["ts"].endswith("+00:00") and "T" in first["ts"]
    assert "request_id" not in second
    assert current_request_id() is None


def test_the_traceback_is_one_string_field(configured: Configure) -> None:
    out = configured()
    try:
        raise ValueError("bad weight")
    except ValueError:
        log.exception("could not load")
    (line,) = lines(out)
    assert line["message"] == "could not load"
    assert "Traceback" in line["exc"] and "ValueError: bad weight" in line["exc"]


def test_a_line_stays_bounded_whatever_is_logged(configured: Configure) -> None:
    out = configured()
    huge = "x" * (MAX_MESSAGE * 10)
    try:
        raise RuntimeError("the end " + "y" * MAX_TRACEBACK * 3 + " last words")
    except RuntimeError:
        log.error("%s", huge, exc_info=True, extra={"field": huge})
    (line,) = lines(out)
    assert len(out.getvalue()) < MAX_MESSAGE + MAX_FIELD + MAX_TRACEBACK + 1000
    assert (
        line["message"].startswith("x" * MAX_MESSAGE) and "more characters cut" in line["message"]
    )
    assert len(line["field"]) < MAX_FIELD + 50
    assert line["exc"].startswith("Traceback") and line["exc"].endswith("last words")


def test_text_format_names_the_process_and_the_request(configured: Configure) -> None:
    out = configured("gateway", GPUFLEET_LOG_FORMAT="text")
    with request_id_bound("abc"):
        log.warning("plane a out of rotation")
    text = out.getvalue()
    assert " WARNING gateway gpufleet.test [abc] plane a out of rotation" in text
    assert not text.startswith("{")


def test_the_level_setting_and_the_process_default(configured: Configure) -> None:
    out = configured("api", GPUFLEET_LOG_LEVEL="debug")
    log.debug("seen")
    assert [line["message"] for line in lines(out)] == ["seen"]
    out = configured("api")  # default INFO
    log.debug("not seen")
    log.info("seen too")
    assert [line["message"] for line in lines(out)] == ["seen too"]


def test_a_setting_not_understood_falls_back_with_a_warning(configured: Configure) -> None:
    out = configured(GPUFLEET_LOG_FORMAT="yaml", GPUFLEET_LOG_LEVEL="LOUD")
    said = [line["message"] for line in lines(out)]
    assert any("GPUFLEET_LOG_FORMAT='yaml'" in s and "json" in s for s in said), said
    assert any("GPUFLEET_LOG_LEVEL='LOUD'" in s and "INFO" in s for s in said), said
    assert logging.getLogger().level == logging.INFO


def test_configuring_again_replaces_the_handler(configured: Configure) -> None:
    first = configured()
    second = configured()
    log.warning("once")
    assert first.getvalue() == ""
    assert [line["message"] for line in lines(second)] == ["once"]


def test_uvicorns_loggers_write_through_ours(configured: Configure) -> None:
    uvicorn = logging.getLogger("uvicorn.error")
    uvicorn.addHandler(logging.StreamHandler())  # as uvicorn's own dictConfig does
    uvicorn.propagate = False
    out = configured("engine-sim")
    uvicorn.warning("Started server process")
    assert lines(out)[0]["logger"] == "uvicorn.error"
    assert uvicorn.handlers == []


def test_request_ids_from_clients_are_cleaned() -> None:
    assert clean_request_id(b"req-42") == "req-42"
    assert clean_request_id("a\nb\x00c\u202ed") == "abcd"
    assert clean_request_id("z" * 1000) == "z" * 64
    assert clean_request_id(" padded ") == "padded"
    assert clean_request_id(" \t") is None
    assert clean_request_id(None) is None


def test_cloud_and_http_clients_never_log_signed_requests_even_at_debug(
    configured: Configure,
) -> None:
    """At GPUFLEET_LOG_LEVEL=DEBUG botocore logs each signed request (an STS session token,
    the access key id), google-auth its token refreshes, urllib3 every URL: secrets."""
    out = configured("worker", GPUFLEET_LOG_LEVEL="DEBUG")
    for name in ("botocore.auth", "botocore.endpoint", "google.auth.transport", "urllib3"):
        logging.getLogger(name).debug("x-amz-security-token:SECRET-%s", name)
        logging.getLogger(name).info("Authorization: Bearer SECRET-%s", name)
    logging.getLogger("botocore.endpoint").warning("retry budget used up")
    log.debug("our own debug line")
    assert [line["message"] for line in lines(out)] == [
        "retry budget used up",
        "our own debug line",
    ]

"""Settings that do not validate stop the process with one line naming the variable, and
never the value: pydantic's own error printed every input (a URL there with its password)
under a traceback, in every process's log."""

from __future__ import annotations

import pytest

from controlplane.settings import SettingsError, load_settings


def test_a_bad_setting_names_its_variable_and_not_its_value(monkeypatch):
    monkeypatch.setenv("GPUFLEET_GATEWAY_URLS", '{"eu": "http://u:S3CRET@gw:8300"}')
    with pytest.raises(SettingsError) as stopped:
        load_settings()
    message = str(stopped.value)
    assert message.startswith("gpufleet cannot start: GPUFLEET_GATEWAY_URLS: ")
    assert "S3CRET" not in message and "gw:8300" not in message


def test_a_rule_across_settings_says_what_to_change(monkeypatch):
    monkeypatch.setenv("GPUFLEET_COST_ACCRUAL_MAX_GAP_S", "1")
    with pytest.raises(SettingsError, match="must be at least twice GPUFLEET_COST_ACCRUE_EVERY_S"):
        load_settings()

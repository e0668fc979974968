"""``credentials_ref: file:/dev/zero`` (or a FIFO, or a huge file) read until the worker ran
out of memory, or blocked it for good: a credentials file is read bounded, regular files
only, and refused with what to change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controlplane.db.models import Provider as ProviderRow
from controlplane.procurement.adapters import MAX_CREDENTIALS_BYTES, provider_config
from providers.base import InvalidRequest


def _row(ref: str) -> ProviderRow:
    return ProviderRow(id="p-1", name="aws-main", kind="aws", generation=1, credentials_ref=ref)


def test_a_device_a_fifo_or_a_huge_file_is_refused_without_reading_it(tmp_path: Path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opened for reading, it would block until a writer came
    huge = tmp_path / "huge.json"
    huge.write_text('{"a": "' + "x" * MAX_CREDENTIALS_BYTES + '"}')
    for ref, says in [
        ("file:/dev/zero", "not a regular file"),
        (f"file:{fifo}", "not a regular file"),
        (f"file:{huge}", f"over {MAX_CREDENTIALS_BYTES} bytes"),
    ]:
        with pytest.raises(InvalidRequest, match=says):
            provider_config(_row(ref), tmp_path)


def test_a_small_json_file_is_read(tmp_path: Path):
    creds = tmp_path / "aws.json"
    creds.write_text('{"region_name": "us-east-1"}')
    assert provider_config(_row(f"file:{creds}"), tmp_path) == {"region_name": "us-east-1"}

"""engine_args are stored, shown by GET and `get -o yaml`, kept in revisions and audit rows
and sent to every plane: a secret there (an HF token, an API key) was echoed everywhere, and
``--config FILE`` let the engine read prompt logging from a file gpufleet never saw."""

from __future__ import annotations

import pytest

from controlplane.specs import checked_engine_args


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("--hf-token=hf_abc", "HF_TOKEN"),
        ("--hf_token", "HF_TOKEN"),
        ("--hf-tok=hf_abc", "HF_TOKEN"),
        ("--api-key=sk-1", "VLLM_API_KEY"),
        ("--api_key", "VLLM_API_KEY"),
        ("--config", "write the options in engine_args"),
        ("--config=/etc/vllm.yaml", "write the options in engine_args"),
        ("--enable-log-req", "log prompts"),
    ],
)
def test_a_secret_or_a_config_file_in_engine_args_is_refused_saying_what_to_do(arg, says):
    with pytest.raises(ValueError, match=says) as refused:
        checked_engine_args(["--max-model-len=512", arg])
    assert "hf_abc" not in str(refused.value) and "sk-1" not in str(refused.value)


@pytest.mark.parametrize(
    "arg",
    ["--hf-overrides={}", "--hf-config-path=/m", "--api-server-count=2", "--config-format=hf"],
)
def test_neighbouring_flags_stay_allowed(arg):
    assert checked_engine_args([arg]) == [arg]

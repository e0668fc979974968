"""The API's problem+json reaches the Terraform user: its detail (what to fix), on the line of
the attribute it names."""

from __future__ import annotations

from tests.integration.terraform.conftest import Api, Terraform

CONFIG = """
provider "gpufleet" {}

resource "gpufleet_provider" "aws" {
  name           = "aws-main"
  provider_kind  = "aws"
  provider_class = "hyperscaler"
}

resource "gpufleet_region" "bad" {
  name          = "aws-nowhere"
  provider_name = gpufleet_provider.aws.name
  code          = "nowhere-1"
  jurisdiction  = "XX"
  latitude      = 0
  longitude     = 0
}
"""


def test_a_refused_spec_names_the_attribute_and_the_fix(terraform: Terraform, api: Api) -> None:
    terraform.write(CONFIG)
    terraform("init", "-input=false")
    result = terraform("apply", "-auto-approve", "-input=false", check=False)
    assert result.returncode == 1
    err = result.stderr
    assert "creating Region 'aws-nowhere': jurisdiction" in err, err
    assert "ISO 3166-1 alpha-2" in err, err
    assert 'jurisdiction  = "XX"' in err, "the diagnostic points at the attribute's line"
    assert api.names("regions") == []
    assert api.names("providers") == ["aws-main"]

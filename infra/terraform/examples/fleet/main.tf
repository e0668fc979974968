# The demo fleet of infra/examples/fleet.yaml (what `gpufleet up` loads on first start), as
# Terraform: three providers, four regions in three jurisdictions, reserved / on-demand / spot
# pools of two GPU types, three clusters and three deployments. Field names are the API's;
# the one exception is `provider_name` (Terraform reserves `provider`).
terraform {
  required_version = ">= 1.5"
  required_providers {
    gpufleet = { source = "gpufleet.local/gpufleet/gpufleet" }
  }
}

# url and token: else GPUFLEET_URL / GPUFLEET_TOKEN, else `gpufleet login`'s file.
provider "gpufleet" {}

# --- providers, GPU types, regions ----------------------------------------------------------

resource "gpufleet_provider" "aws_main" {
  name            = "aws-main"
  provider_kind   = "aws"
  provider_class  = "hyperscaler"
  certifications  = ["SOC2", "HIPAA", "ISO27001"]
  credentials_ref = "env:AWS_PROFILE"
}

resource "gpufleet_provider" "lambda" {
  name            = "lambda"
  provider_kind   = "lambda"
  provider_class  = "neocloud"
  certifications  = ["SOC2"]
  credentials_ref = "env:LAMBDA_API_KEY"
}

resource "gpufleet_provider" "local" {
  name           = "local"
  provider_kind  = "local"
  provider_class = "neocloud"
  certifications = ["SOC2", "HIPAA"]
}

resource "gpufleet_gpu_type" "h100" {
  name       = "H100-80G"
  memory_gib = 80
}

resource "gpufleet_gpu_type" "l40s" {
  name       = "L40S-48G"
  memory_gib = 48
}

locals {
  regions = {
    "aws-us-east-1"    = { provider = gpufleet_provider.aws_main.name, code = "us-east-1", jurisdiction = "US", latitude = 38.9, longitude = -77.4 }
    "aws-eu-central-1" = { provider = gpufleet_provider.aws_main.name, code = "eu-central-1", jurisdiction = "DE", latitude = 50.1, longitude = 8.7 }
    "lambda-us-tx"     = { provider = gpufleet_provider.lambda.name, code = "us-south-1", jurisdiction = "US", latitude = 30.3, longitude = -97.7 }
    "local-tokyo"      = { provider = gpufleet_provider.local.name, code = "lab", jurisdiction = "JP", latitude = 35.7, longitude = 139.7 }
  }
}

resource "gpufleet_region" "this" {
  for_each      = local.regions
  name          = each.key
  provider_name = each.value.provider
  code          = each.value.code
  jurisdiction  = each.value.jurisdiction
  latitude      = each.value.latitude
  longitude     = each.value.longitude
}

# --- pools: reserved, on-demand, spot -------------------------------------------------------

resource "gpufleet_pool" "aws_use1_h100_reserved" {
  name               = "aws-use1-h100-reserved"
  provider_name      = gpufleet_provider.aws_main.name
  region             = gpufleet_region.this["aws-us-east-1"].name
  gpu_type           = gpufleet_gpu_type.h100.name
  purchase_type      = "reserved"
  gpus               = 16
  gpus_per_instance  = 8
  instance_type      = "p5.48xlarge"
  price_per_gpu_hour = "2.10"
  term_start         = "2026-01-01T00:00:00Z"
  term_end           = "2027-12-31T00:00:00Z"
  committed_gpus     = 16
}

resource "gpufleet_pool" "aws_use1_h100_od" {
  name               = "aws-use1-h100-od"
  provider_name      = gpufleet_provider.aws_main.name
  region             = gpufleet_region.this["aws-us-east-1"].name
  gpu_type           = gpufleet_gpu_type.h100.name
  purchase_type      = "on_demand"
  gpus               = 0
  gpus_per_instance  = 8
  instance_type      = "p5.48xlarge"
  price_per_gpu_hour = "6.88"
  quota_gpus         = 64
}

resource "gpufleet_pool" "aws_use1_l40s_spot" {
  name                   = "aws-use1-l40s-spot"
  provider_name          = gpufleet_provider.aws_main.name
  region                 = gpufleet_region.this["aws-us-east-1"].name
  gpu_type               = gpufleet_gpu_type.l40s.name
  purchase_type          = "spot"
  gpus                   = 8
  gpus_per_instance      = 1
  instance_type          = "g6e.xlarge"
  price_per_gpu_hour     = "0.93"
  interruptions_per_hour = "0.05"
  notice_seconds         = 120
}

resource "gpufleet_pool" "aws_euc1_h100_od" {
  name               = "aws-euc1-h100-od"
  provider_name      = gpufleet_provider.aws_main.name
  region             = gpufleet_region.this["aws-eu-central-1"].name
  gpu_type           = gpufleet_gpu_type.h100.name
  purchase_type      = "on_demand"
  gpus               = 8
  gpus_per_instance  = 8
  instance_type      = "p5.48xlarge"
  price_per_gpu_hour = "7.21"
  quota_gpus         = 32
}

resource "gpufleet_pool" "lambda_ustx_h100_od" {
  name               = "lambda-ustx-h100-od"
  provider_name      = gpufleet_provider.lambda.name
  region             = gpufleet_region.this["lambda-us-tx"].name
  gpu_type           = gpufleet_gpu_type.h100.name
  purchase_type      = "on_demand"
  gpus               = 8
  gpus_per_instance  = 8
  instance_type      = "gpu_8x_h100_sxm5"
  price_per_gpu_hour = "2.99"
  quota_gpus         = 16
}

resource "gpufleet_pool" "local_l40s" {
  name               = "local-l40s"
  provider_name      = gpufleet_provider.local.name
  region             = gpufleet_region.this["local-tokyo"].name
  gpu_type           = gpufleet_gpu_type.l40s.name
  purchase_type      = "reserved"
  gpus               = 4
  gpus_per_instance  = 4
  price_per_gpu_hour = "0"
  term_start         = "2026-01-01T00:00:00Z"
  term_end           = "2030-01-01T00:00:00Z"
  committed_gpus     = 4
}

# --- clusters -------------------------------------------------------------------------------

resource "gpufleet_cluster" "use1_a" {
  name   = "use1-a"
  region = gpufleet_region.this["aws-us-east-1"].name
  pools = [
    gpufleet_pool.aws_use1_h100_reserved.name,
    gpufleet_pool.aws_use1_h100_od.name,
    gpufleet_pool.aws_use1_l40s_spot.name,
  ]
}

resource "gpufleet_cluster" "euc1_a" {
  name   = "euc1-a"
  region = gpufleet_region.this["aws-eu-central-1"].name
  pools  = [gpufleet_pool.aws_euc1_h100_od.name]
}

resource "gpufleet_cluster" "local_a" {
  name   = "local-a"
  region = gpufleet_region.this["local-tokyo"].name
  pools  = [gpufleet_pool.local_l40s.name]
}

# --- deployments: residency-restricted, HIPAA, spot tolerant --------------------------------

resource "gpufleet_deployment" "eu_assistant" {
  name             = "eu-assistant"
  model_id         = "mistralai/Mistral-Small-24B-Instruct-2501"
  gpus_per_replica = 2
  gpu_types        = [gpufleet_gpu_type.h100.name]
  priority         = 300
  traffic          = { (gpufleet_region.this["aws-eu-central-1"].name) = 1.0 }
  autoscaling {
    min_replicas       = 1
    max_replicas       = 4
    target_concurrency = 32
  }
  placement {
    allowed_jurisdictions = ["DE"]
  }
}

resource "gpufleet_deployment" "triage_llm" {
  name             = "triage-llm"
  model_id         = "meta-llama/Llama-3.1-70B-Instruct"
  gpus_per_replica = 4
  gpu_types        = [gpufleet_gpu_type.h100.name]
  priority         = 500
  traffic = {
    (gpufleet_region.this["aws-us-east-1"].name) = 0.7
    (gpufleet_region.this["lambda-us-tx"].name)  = 0.3
  }
  autoscaling {
    min_replicas       = 2
    max_replicas       = 6
    target_concurrency = 16
  }
  placement {
    required_certifications = ["HIPAA"]
    allowed_jurisdictions   = ["US"]
  }
}

resource "gpufleet_deployment" "batch_summarizer" {
  name             = "batch-summarizer"
  model_id         = "Qwen/Qwen2.5-7B-Instruct"
  gpus_per_replica = 1
  gpu_types        = [gpufleet_gpu_type.l40s.name, gpufleet_gpu_type.h100.name]
  priority         = 50
  autoscaling {
    min_replicas               = 0
    max_replicas               = 8
    scale_to_zero_idle_seconds = 300
  }
  placement {
    spot_allowed      = true
    max_spot_fraction = 1.0
  }
}

# --- what the control plane made of it ------------------------------------------------------

data "gpufleet_gpu_types" "all" {
  depends_on = [gpufleet_gpu_type.h100, gpufleet_gpu_type.l40s]
}

data "gpufleet_cluster" "use1_a" {
  name = gpufleet_cluster.use1_a.name
}

output "gpu_types" {
  value = data.gpufleet_gpu_types.all.memory_gib
}

output "use1_a_state" {
  value = data.gpufleet_cluster.use1_a.state
}

# The agent's NATS login, shown once by the API at creation (sensitive; in the state only):
#   terraform output -json use1_a_nats_credentials
output "use1_a_nats_credentials" {
  value     = gpufleet_cluster.use1_a.nats_credentials
  sensitive = true
}

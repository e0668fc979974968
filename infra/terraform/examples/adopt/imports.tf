# Adopt the demo fleet `make up` loaded (infra/examples/fleet.yaml) instead of creating it:
# copy this file next to ../fleet/main.tf and `terraform apply` imports every object by
# name (docs/terraform.md). Delete it once the state holds them.

import {
  to = gpufleet_provider.aws_main
  id = "aws-main"
}

import {
  to = gpufleet_provider.lambda
  id = "lambda"
}

import {
  to = gpufleet_provider.local
  id = "local"
}

import {
  to = gpufleet_gpu_type.h100
  id = "H100-80G"
}

import {
  to = gpufleet_gpu_type.l40s
  id = "L40S-48G"
}

import {
  to = gpufleet_region.this["aws-us-east-1"]
  id = "aws-us-east-1"
}

import {
  to = gpufleet_region.this["aws-eu-central-1"]
  id = "aws-eu-central-1"
}

import {
  to = gpufleet_region.this["lambda-us-tx"]
  id = "lambda-us-tx"
}

import {
  to = gpufleet_region.this["local-tokyo"]
  id = "local-tokyo"
}

import {
  to = gpufleet_pool.aws_use1_h100_reserved
  id = "aws-use1-h100-reserved"
}

import {
  to = gpufleet_pool.aws_use1_h100_od
  id = "aws-use1-h100-od"
}

import {
  to = gpufleet_pool.aws_use1_l40s_spot
  id = "aws-use1-l40s-spot"
}

import {
  to = gpufleet_pool.aws_euc1_h100_od
  id = "aws-euc1-h100-od"
}

import {
  to = gpufleet_pool.lambda_ustx_h100_od
  id = "lambda-ustx-h100-od"
}

import {
  to = gpufleet_pool.local_l40s
  id = "local-l40s"
}

import {
  to = gpufleet_cluster.use1_a
  id = "use1-a"
}

import {
  to = gpufleet_cluster.euc1_a
  id = "euc1-a"
}

import {
  to = gpufleet_cluster.local_a
  id = "local-a"
}

import {
  to = gpufleet_deployment.eu_assistant
  id = "eu-assistant"
}

import {
  to = gpufleet_deployment.triage_llm
  id = "triage-llm"
}

import {
  to = gpufleet_deployment.batch_summarizer
  id = "batch-summarizer"
}

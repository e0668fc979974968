"""The gpufleet Terraform provider (PyPI `tf`, plugin protocol v6): the admin API's kinds as
resources with the API's field names, and read-only data sources."""

PROVIDER_ADDRESS = "gpufleet.local/gpufleet/gpufleet"
VERSION = "0.1.0"

"""The `gpufleet` provider: its configuration (url, token, with the CLI's precedence) and the
client every resource and data source shares."""

from __future__ import annotations

from typing import Any

from tf import schema, types
from tf.iface import DataSource, Provider, Resource
from tf.types import Unknown
from tf.utils import Diagnostics

from gpufleet_tf import PROVIDER_ADDRESS
from gpufleet_tf.client import ApiProblem, Client
from gpufleet_tf.connection import ConnectionError_, resolve
from gpufleet_tf.data_sources import DATA_SOURCES
from gpufleet_tf.resources import resource_classes


class GpufleetProvider(Provider):
    def __init__(self) -> None:
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:  # only when Terraform skipped ConfigureProvider
            self._client = Client(resolve(None, None))
        return self._client

    def get_model_prefix(self) -> str:
        return "gpufleet_"

    def full_name(self) -> str:
        return PROVIDER_ADDRESS

    def get_provider_schema(self, diags: Diagnostics) -> schema.Schema:
        return schema.Schema(
            attributes=[
                schema.Attribute(
                    "url",
                    types.String(),
                    optional=True,
                    description="The API, e.g. http://127.0.0.1:8080. Else GPUFLEET_URL, else "
                    "the CLI's login file, else http://127.0.0.1:8080.",
                ),
                schema.Attribute(
                    "token",
                    types.String(),
                    optional=True,
                    sensitive=True,
                    description="An API token. Else GPUFLEET_TOKEN, else the CLI's login file.",
                ),
            ]
        )

    def validate_config(self, diags: Diagnostics, config: dict[str, Any]) -> None:
        url = config.get("url")
        if isinstance(url, str) and not url.startswith(("http://", "https://")):
            diags.add_error(
                "url must start with http:// or https://",
                f"got {url!r}; e.g. http://127.0.0.1:8080",
                path=["url"],
            )

    def configure_provider(self, diags: Diagnostics, config: dict[str, Any]) -> None:
        url, token = (config.get(k) for k in ("url", "token"))
        try:
            connection = resolve(
                url if isinstance(url, str) else None,
                token if isinstance(token, str) and token is not Unknown else None,
            )
        except ConnectionError_ as exc:
            diags.add_error("cannot read the gpufleet login file", str(exc))
            return
        try:
            self._client = Client(connection)
        except ApiProblem as problem:  # a URL from GPUFLEET_URL or the login file: a traceback
            diags.add_error(
                "the gpufleet URL cannot be used",
                f"{problem.detail} (it came from the provider block, GPUFLEET_URL or the "
                "gpufleet login file, in that order)",
            )

    def get_resources(self) -> list[type[Resource]]:
        return list(resource_classes())

    def get_data_sources(self) -> list[type[DataSource]]:
        return list(DATA_SOURCES)

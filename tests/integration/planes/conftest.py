from tests.integration.api.conftest import (  # noqa: F401  (shared fixtures)
    admin,
    app_client,
    engine,
    operator,
    session_factory,
    tokens,
    viewer,
)

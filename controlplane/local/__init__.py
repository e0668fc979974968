"""Local servers for development and tests (embedded nats-server, …)."""

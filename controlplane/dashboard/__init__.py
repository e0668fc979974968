"""The web dashboard: server-rendered pages (Jinja2 + htmx + server-sent events) served by
the API process at `/`, reading through the services like the API does (docs/dashboard.md)."""

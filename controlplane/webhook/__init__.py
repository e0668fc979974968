"""The export of events and audit entries to a webhook: pure decisions (`core`), SQL
(`store`), the worker's task (`tasks`). docs/logging.md has the payload and the rules."""

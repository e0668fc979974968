"""The fleet's front door: one OpenAI endpoint over every plane (docs/gateway.md)."""

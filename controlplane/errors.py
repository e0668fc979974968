"""Typed errors raised inside the control plane; the API turns each into RFC 9457 problem JSON.

Every message says what to change, not only what went wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FieldError:
    field: str
    message: str


class ControlPlaneError(Exception):
    status: int = 500
    title: str = "Internal error"
    slug: str = "internal"

    def __init__(self, detail: str, errors: list[FieldError] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors or []


class InvalidSpec(ControlPlaneError):
    status = 422
    title = "Invalid specification"
    slug = "invalid-spec"

    @classmethod
    def on(cls, field_name: str, message: str) -> InvalidSpec:
        return cls(f"{field_name}: {message}", [FieldError(field_name, message)])


class BadRequest(ControlPlaneError):
    status = 400
    title = "Bad request"
    slug = "bad-request"


class NotFound(ControlPlaneError):
    status = 404
    title = "Not found"
    slug = "not-found"


class Conflict(ControlPlaneError):
    status = 409
    title = "Conflict"
    slug = "conflict"


class StaleGeneration(Conflict):
    title = "Stale generation"
    slug = "stale-generation"


class InUse(Conflict):
    title = "Still in use"
    slug = "in-use"


class Unauthenticated(ControlPlaneError):
    status = 401
    title = "Unauthenticated"
    slug = "unauthenticated"


class Forbidden(ControlPlaneError):
    status = 403
    title = "Forbidden"
    slug = "forbidden"


class DatabaseUnavailable(ControlPlaneError):
    """PostgreSQL does not answer; the request may be retried (nothing was changed)."""

    status = 503
    title = "Database unavailable"
    slug = "database-unavailable"


@dataclass
class Problem:
    """RFC 9457 body."""

    status: int
    title: str
    detail: str
    type: str
    instance: str | None = None
    errors: list[FieldError] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        body: dict[str, object] = {
            "type": self.type,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if self.instance:
            body["instance"] = self.instance
        if self.errors:
            body["errors"] = [{"field": e.field, "message": e.message} for e in self.errors]
        return body


def problem_for(error: ControlPlaneError, instance: str | None = None) -> Problem:
    return Problem(
        status=error.status,
        title=error.title,
        detail=error.detail,
        type=f"https://gpufleet.dev/problems/{error.slug}",
        instance=instance,
        errors=error.errors,
    )

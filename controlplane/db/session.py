"""Engine and session factory; one per process, built by its composition root."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session, sessionmaker

LOCK_TIMEOUT_S = 30.0
IDLE_IN_TRANSACTION_S = 60.0


def make_engine(
    url: str,
    pool_size: int = 10,
    *,
    lock_timeout_s: float = LOCK_TIMEOUT_S,
    idle_in_transaction_s: float = IDLE_IN_TRANSACTION_S,
) -> Engine:
    """An engine whose PostgreSQL sessions wait at most ``lock_timeout_s`` for a lock (then
    the statement fails: the API answers 503, a task retries) and are ended by the server
    once idle inside a transaction for ``idle_in_transaction_s`` (a process frozen or stuck
    mid-transaction no longer holds its row and advisory locks for good); 0 turns either
    off."""
    connect_args: dict[str, str] = {}
    if url.startswith("postgresql"):
        connect_args["options"] = (
            f"-c lock_timeout={round(lock_timeout_s * 1000)} "
            f"-c idle_in_transaction_session_timeout={round(idle_in_transaction_s * 1000)}"
        )
    # No pre-ping: it costs a round trip per checkout; stale connections are recycled instead.
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_recycle=300,
        connect_args=connect_args,
    )


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def make_read_engine(engine: Engine) -> Engine:
    """The engine for reads only: autocommit, so no BEGIN/COMMIT round trips per request."""
    return engine.execution_options(isolation_level="AUTOCOMMIT")


def make_read_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions for reads only, on `make_read_engine(engine)`."""
    return sessionmaker(make_read_engine(engine))


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose work commits on success and rolls back on any error."""
    with factory() as session, session.begin():
        yield session

"""Engine and session factory; one per process, built by its composition root."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str, pool_size: int = 10) -> Engine:
    # No pre-ping: it costs a round trip per checkout; stale connections are recycled instead.
    return create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_recycle=300)


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

"""A fresh PostgreSQL database per test, on the server at 127.0.0.1:5432 (or
``SWEEPER_TEST_PG``, a libpq URL of a database to connect to as admin).

Tests that use the ``pg_url`` fixture skip, with the reason, only when no
server answers (and fail with it instead where ``SWEEPER_REQUIRE_SERVICES=1``, as
in CI); any other failure is a test failure.
"""
from __future__ import annotations

import os
import uuid

import pytest
import sqlalchemy

ADMIN_URL = os.environ.get("SWEEPER_TEST_PG", "postgresql://127.0.0.1:5432/postgres")


def skip_unless_required(reason: str) -> None:
    """Skip with ``reason``; fail with it where SWEEPER_REQUIRE_SERVICES=1 (CI), so a
    service that did not come up cannot pass as a green run."""
    if os.environ.get("SWEEPER_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} [SWEEPER_REQUIRE_SERVICES=1]", pytrace=False)
    pytest.skip(reason)


def _admin_connection():
    import psycopg

    try:
        return psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    # outside the except block, so that a failure does not chain psycopg's traceback
    skip_unless_required(f"no PostgreSQL server reachable at {ADMIN_URL} ({first}); "
                         "start one (see .ci/run) or set SWEEPER_TEST_PG")


def database_url(name: str) -> str:
    url = sqlalchemy.engine.make_url(ADMIN_URL).set(drivername="postgresql+psycopg", database=name)
    return url.render_as_string(hide_password=False)


@pytest.fixture
def pg_url():
    """A SQLAlchemy URL of a new, empty database; dropped after the test."""
    admin = _admin_connection()
    name = f"sweeper_test_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url(name)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()

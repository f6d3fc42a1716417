"""Storage URLs: which engine a URL names, and the form that is safe to print (no password). Where a
SQLite file lives is :func:`sweeper.config.anchor.sqlite_path` (the study file's anchor needs it too)."""

import sqlalchemy


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def is_postgres(url: str) -> bool:
    return url.startswith("postgresql")


def normalize_url(url: str) -> str:
    # SQLAlchemy 2.1 maps postgresql:// to psycopg 3; older ones to psycopg2.
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def redact(url: str) -> str:
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001
        return url

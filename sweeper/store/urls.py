"""Storage URLs: which engine a URL names. Where a SQLite file lives and the form that is safe to print
(no password) are :func:`sweeper.config.anchor.sqlite_path` and ``redact`` (the config needs them too)."""


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def is_postgres(url: str) -> bool:
    return url.startswith("postgresql")


def normalize_url(url: str) -> str:
    # SQLAlchemy 2.1 maps postgresql:// to psycopg 3; older ones to psycopg2.
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url

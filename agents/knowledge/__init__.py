"""The knowledge base: documents read and chunked, embedded, stored in Postgres (pgvector and full text),
and searched with both, fused."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The repository's root (shipped files such as manifest.yml and .env.example are checked there)."""

"""The playground (`python -m bot playground`, `app.py`): the whole bot on this machine against a local Slack
workspace (`slack_emulator.py`, which the tests and benchmarks use too) and a page that drives it (`static/`)."""

"""What the tests and the benchmarks share to run the bot for real (not part of the installed package):

- `harness.database`: a Postgres server (the embedded one, or the one an environment variable names), a
  throwaway database built by the Alembic migrations, and waiting until the bot has nothing left to do;
- `harness.bot`: the bot's settings against the fakes, the bot in this process or as `python -m bot serve`;
- `harness.slack`: messages sent to the bot as Slack's signed events (through the emulator, timed), and a
  watcher over the emulator's record of the bot's Web API calls;
- `harness.teams`: Teams-shaped activities delivered to the bot with tokens the Teams emulator signs (or broken
  ones), the bot's Teams settings, and a watcher of its Bot Connector posts;
- `harness.scenarios`: Slack scenarios several test modules play (a case escalated and resolved, `/support`);
- `harness.llm`: the model and loop configuration of the agents against the fake LLM;
- `harness.slack_calls`: the Slack Web API calls the bot's code makes, read from its source.

The emulators are not here: the OpenAI-compatible server and Teams are in `fakes/` (repository only), Slack is
`bot.playground.slack_emulator` (shipped, since the playground runs it).
"""

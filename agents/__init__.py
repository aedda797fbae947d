"""The handoff engine: agents, tools, the run loop and durable conversations. Never imports Slack."""

"""The Slack bot and the command line around the engine."""

"""The Slack channel: the Bolt app, Events API parsing, the Web API messenger, files, the AI status and the App Home."""

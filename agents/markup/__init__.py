"""Text as Slack shows it: untrusted text made inert (`agents.markup.text`), and what Slack accepts in a message
(`agents.markup.limits`). Pure functions, used by `bot` and `escalation` alike; nothing here talks to Slack."""

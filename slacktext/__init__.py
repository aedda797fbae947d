"""Text as Slack shows it: untrusted text made inert (`slacktext.text`), and what Slack accepts in a message
(`slacktext.limits`). Pure functions, used by `bot` and `escalation` alike; nothing here talks to Slack."""

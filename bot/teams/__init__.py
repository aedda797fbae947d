"""Text as Teams shows it: untrusted text made inert and our Slack texts carried over (`bot.teams.text`), what Teams
delivers read back as what a person wrote (`bot.teams.html`), Block Kit as an Adaptive Card (`bot.teams.cards`) and
what a Teams message holds (`bot.teams.limits`). Pure functions; nothing here talks to Teams."""

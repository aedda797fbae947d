"""Text as Teams shows it: untrusted text made inert and our Slack texts carried over (`teamstext.text`), what Teams
delivers read back as what a person wrote (`teamstext.incoming`), Block Kit as an Adaptive Card (`teamstext.cards`) and
what a Teams message holds (`teamstext.limits`). Pure functions; nothing here talks to Teams."""

"""The channels Postgres wakes the bot's processes on (LISTEN/NOTIFY): new messages to run, new rows to send. The
migrations' triggers name them too (0009_leases), as they stood when written."""

TURNS = "helpdesk_turns"
SENDS = "helpdesk_sends"

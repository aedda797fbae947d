"""The staff side of human takeover: cases in the staff channel, the two-way relay, claim, resolve, hand back
and reminders. The engine ends a turn with `Escalate` and owns the conversation's mode; this package tells
staff and relays between them and the customer."""

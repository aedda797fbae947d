"""The staff side of human takeover: cases in the staff channel and the two-way relay (escalation issue).

The engine already ends a turn with `Escalate` and sets the conversation to `awaiting_human`; this package
will post the case and relay messages.
"""

"""Delivery: what the channels are owed, and the one sender that posts, edits and deletes for every channel.

- `owed`: what a turn owes (`TurnOutbox`, the engine's after_turn hook), as the conversation's channel shows it.
- `sender`: `OutboxSender`, the loop and its policy: order, attempts, backoff, give-ups, exactly-once posts.
- `ledger`: what the sender records of each row (send leases, attempts, claims, outcomes), fenced by its lease.
- `messages`: each delivery as its messenger's calls (where it goes, what it shows, a change made).
- `shares`: file relays where the channel shares files.
- `pacing`: per channel, one post per turn after a 429.
- `alerts`: what the admins are told when a delivery cannot be mended.
"""

"""Delivery: the outbox, and the one sender that posts, edits and deletes for every channel."""

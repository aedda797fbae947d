"""The process at run time: start-up (settings in, a ready database and engine out) and the background workers."""

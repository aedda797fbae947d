"""`/support`: the slash command admins steer the bot with. parse (text to a typed command), queries (read-only
answers), actions (changes), views (Block Kit) and command (the Bolt listener: who may, ack, run, record)."""

"""What every channel is to the rest of the bot: typed incoming values, the intake that stores them, and the calls a
channel makes for the outbox."""

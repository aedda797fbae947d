"""The operator's declaration of their helpdesk: `parse` reads and checks the file, `build` makes it into the roster,
tools and texts that run, `scaffold` writes a commented starter for a new company."""

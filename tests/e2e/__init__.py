"""End-to-end tests: the bot over a fake Slack (HTTP mode, Socket Mode, the console)."""

"""The /gpu language, Slack-agnostic: parsing, the command registry and dispatcher, role
checks at the door, and commands as plain functions (actor, args, services) -> Reply.
Never imports Slack or Kubernetes; calls workflows/ for everything it knows."""

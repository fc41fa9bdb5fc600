"""The process and its Slack face: the Bolt app (Socket Mode and HTTP), the console,
the command line, rendering replies to Block Kit, and the notifier that posts the
outbox. The only package that imports slack_bolt or slack_sdk."""

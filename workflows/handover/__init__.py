"""The shift handover: rotations and their shifts (`rotations`), the checklist built
from the fleet, requests, runs and drains and rendered by a sandboxed template
(`checklist`, `templates/`), the service that posts, reminds and records
acknowledgements, and their sentences. May import every package but `config`."""

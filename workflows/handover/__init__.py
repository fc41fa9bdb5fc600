"""The shift handover: rotations and their shifts (`rotations`), the checklist as a value
and as stored (`checklist`), built from the fleet, requests, runs and drains
(`building`) and laid out by a sandboxed template (`layout`, `templates/`), the service
that posts, reminds and records acknowledgements, and their sentences. May import every
package but `config`."""

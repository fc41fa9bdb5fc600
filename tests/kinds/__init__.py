"""Kinds of change that exist only in the tests, each a package added the way a real kind
is (workflows/kinds.py's docstring): its registry line, plan, service, commands module
and step logic, touching no product file."""

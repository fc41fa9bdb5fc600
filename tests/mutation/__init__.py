"""Mutation testing of the safety modules (`make mutation`, not part of `make test`)."""

"""Preflight: read the host's facts and run every compatibility rule before any change.

A host that fails a rule gets a single operation that prints the rule's
message and fails, so pyinfra stops that host and goes on with the others;
``deploy.py`` adds nothing more for it. With ``--dry`` the messages are
printed while the deploy is planned.
"""

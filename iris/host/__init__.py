"""iris.host: the module paths Iris's programs import host-side pieces from (iris.host.logging). The
pieces themselves live in iris's own modules (iris/logging.py)."""

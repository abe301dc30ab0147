"""Subcommands of the ``lenserve`` command line (see lenserve/cli.py)."""

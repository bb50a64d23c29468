"""Raven's own subcommands; each module adds one or two with a ``register_*`` function.

The CLI (raven_cli/main.py) imports a module here only when its subcommand runs."""

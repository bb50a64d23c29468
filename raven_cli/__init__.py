"""The `raven` command: the composition roots (the CLI, its subcommands, the demo) that put
the library (raven/) and the applications together. Nothing imports this package but its
entry point."""

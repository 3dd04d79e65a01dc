"""The ``trainsim`` command line: small, stable subcommands, ``--json`` for machines, tables for people."""

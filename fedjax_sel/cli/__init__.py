"""The ``fedjax-sel`` command line: :mod:`fedjax_sel.cli.main` holds the parser and dispatch,
and each command has a module of its own."""

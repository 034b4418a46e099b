"""The ``hf-distprof`` command line: one module per subcommand."""

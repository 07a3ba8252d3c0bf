"""The ``pmi-reward`` command line: one module per subcommand, dataclass arguments parsed by TrlParser."""

"""The ``pmi-reward`` command line: one thin module per subcommand; each parses the concepts' dataclasses with
``pmi_reward.configs.parse_args`` (``--config`` YAML, then flags) and calls the library."""

"""The ``elasticrun`` launcher: command line (:mod:`.cli`) → :class:`~.config.LaunchConfig` → agent."""

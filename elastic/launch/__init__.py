"""The ``elasticrun`` launcher: command line (:mod:`.cli`) → :class:`elastic.config.LaunchConfig` → :func:`.runner.run`."""

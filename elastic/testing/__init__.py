"""Test support shipped with the package: the backend contract suite, real-server harnesses and
the launched-process harness (:mod:`elastic.testing.agents`)."""

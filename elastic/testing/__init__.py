"""Test support shipped with the package: for testing your own backend or training script.

The public modules (docs/backends.md, "Testing your own backend or training script"):

- :mod:`elastic.testing.agents`: launchers as real processes, a job of several, bounded waits::

      with Job(tmp_path, timeout=120) as job:
          job.start("a", [*with_stacks.command("elastic.run"), *flags])
          assert job.collect() == {"a": 0}, job.logs()

- :mod:`elastic.testing.with_stacks`: run a module so that SIGUSR1 dumps its Python threads
  (``with_stacks.command("elastic.run")``; a hang report asks for them);
- :mod:`elastic.testing.etcd_server`: a real etcd for tests, and its contract harness::

      with start_etcd_server(EtcdServerOptions(auth=True)) as etcd, etcd.connect() as backend:
          backend.put("/my-test/key", b"value")

- :mod:`elastic.testing.ports`: ``free_port()``, a port below the ephemeral range;
- :mod:`elastic.testing.contract` and :mod:`elastic.testing.harness`: the backend contract
  suite and what it needs of a backend (``class TestMine(BackendContract)`` with a ``harness``
  fixture returning a :class:`~elastic.testing.harness.BackendHarness`);
- :mod:`elastic.testing.tcp_store` and :mod:`elastic.testing.fake_store`: the harnesses of the
  built-in TCP store and the in-memory fake.

:mod:`~elastic.testing.hang_report`, :mod:`~elastic.testing.os_threads` and
:mod:`~elastic.testing.tls` serve those and are not for direct use. This repository's own test
helpers (fault injection, etcd clusters, fakes of the agent's internals) are in
``tests/support`` and are not installed.
"""

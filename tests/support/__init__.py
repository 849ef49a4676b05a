"""Helpers for this repository's own tests and benchmarks; not shipped in the wheel.

What a user of etcd-elastic imports to test a backend or a training script stays in
:mod:`elastic.testing`. The rest lives here: imported as ``support.<module>``, with ``tests/``
on ``sys.path`` (pytest's ``pythonpath`` option in ``pyproject.toml``; a benchmark inserts it
itself).
"""

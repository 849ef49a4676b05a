"""Workers die with their agent: the parent-death signal, the PID file, and the watchdog.

Kept light: the worker templates import :mod:`.pdeathsig` (stdlib only) through this package.
"""

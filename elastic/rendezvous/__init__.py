"""Rendezvous engine: lease-based, watch-driven rounds over the backend contract."""

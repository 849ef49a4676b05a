"""Pluggable key-value backends: the contract, etcd v3, the built-in TCP store, an in-memory fake."""

"""etcd v3 backend over gRPC."""

"""A node's worker processes: their environment, start, output, process trees, failures and stop,
and the store helper that serves the workers' TCPStore on the master node."""

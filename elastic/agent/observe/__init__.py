"""What the agent tells the outside: the structured event log and the Prometheus metrics."""

"""Built-in TCP store: an asyncio server and a thread-safe client with etcd semantics."""

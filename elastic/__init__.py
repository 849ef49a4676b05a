"""etcd-elastic: elastic rendezvous, agent and launcher for PyTorch."""

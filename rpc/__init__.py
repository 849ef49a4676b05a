"""Distributed autograd over torch.distributed.rpc for elastic jobs."""

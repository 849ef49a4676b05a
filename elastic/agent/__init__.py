"""The elastic agent: one per node; starts, watches and stops its worker group.

Nothing here imports torch.
"""

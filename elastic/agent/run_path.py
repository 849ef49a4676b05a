"""The program a ``--run-path`` worker runs (``python -u -c RUN_PATH_BOOTSTRAP script args``).

torchrun runs a ``--run-path`` script as a function, ``runpy.run_path(script, run_name="__main__")``
with ``sys.argv = [script, *args]``, in a spawned interpreter, and each worker then waits until
every worker of its node has returned before its process exits (torch's ``MultiprocessContext``
holds them on an event the agent sets once it has read every return value). Scripts rely on it
without knowing: one that ends without ``destroy_process_group()`` runs clean under torchrun,
while, run as plain scripts (torchrun without ``--run-path``, or our workers before this), a
worker whose peers had already left was at times aborted at exit by torch (``terminate called
without an active exception``).

The bootstrap waits the same way, without the agent and without a file of its own: each worker
holds a shared ``flock`` on its attempt's log directory (``attempt_<k>``, the grandparent of its
``TORCHELASTIC_ERROR_FILE``, private to this agent and attempt) while its script runs; a worker
whose script returned, or called ``sys.exit(0)``, releases it and takes an exclusive lock, which
the kernel grants once no worker of the node still runs its script, then exits. A worker that
dies releases its lock with its last descriptor, so it never holds the others. A script that
fails leaves at once, as under torchrun. Unlike torchrun's, the wait does not cover a worker that
has not started its script yet (nothing tells it from one that left): workers that meet in a
process group cannot finish before all of them started, and those are the ones it is for. Where
the lock cannot be had (no such directory, a file system without ``flock``), the worker exits as
it did before.

Then, where the script left its default process group, the bootstrap destroys it (after a
collection, which frees what held it in reference cycles) while the interpreter still runs: a
gloo thread that drops a collective's last work during finalization aborts the process the same
way, and the barrier alone did not rule that out (a CI run saw it once).

Stdlib only: the pre-warmed template (:mod:`elastic.agent.prewarm.template`) runs the same text.
"""

from __future__ import annotations

__all__ = ["RUN_PATH_BOOTSTRAP"]

RUN_PATH_BOOTSTRAP = """\
import runpy, sys
del sys.argv[0]
def _node_exit_barrier():
    import fcntl, os
    error_file = os.environ.get('TORCHELASTIC_ERROR_FILE', '')
    rank_dir = os.path.dirname(error_file)
    attempt_dir = os.path.dirname(rank_dir)
    if (os.path.basename(rank_dir) != os.environ.get('LOCAL_RANK')
            or not os.path.basename(attempt_dir).startswith('attempt_')):
        return lambda: None
    try:
        fd = os.open(attempt_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:
        return lambda: None
    def wait_for_the_nodes_workers():
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        os.close(fd)
    return wait_for_the_nodes_workers
_wait = _node_exit_barrier()
try:
    runpy.run_path(sys.argv[0], run_name='__main__')
except SystemExit as _exit:
    if _exit.code not in (0, None):
        raise
_wait()
_dist = sys.modules.get('torch.distributed')
if _dist is not None:
    try:
        if _dist.is_available() and _dist.is_initialized():
            import gc
            gc.collect()
            _dist.destroy_process_group()
    except Exception:
        pass
"""

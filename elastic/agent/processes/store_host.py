"""The workers' store on the master node, served on the master port the join published.

The round record names group rank 0's master port, which that node's rendezvous handler has
been listening on since its join (:mod:`elastic.rendezvous.ports`). Peers' workers may connect
as soon as the round closes; their connections wait in the accept queue until a store serves
the socket. The agent does not import torch, so a helper process does it: it imports torch
once, and for each attempt on this node receives the listening socket over a Unix socket pair
(``SCM_RIGHTS``) and serves a ``TCPStore`` on it (``master_listen_fd``). Workers then connect as
clients (``TORCHELASTIC_USE_AGENT_STORE=True``, as under torchrun), so no worker ever meets a
refused connection, and a restart does not wait for a store to bind. The store of the attempt
before stays served until the next hand-over: a live worker that leaves a round for the next
ends that round's generations in its store (:func:`elastic.worker.refill.leave_round`), which
it can do only while that store answers. The helper dies with the
agent: it exits when its end of the pair reads EOF. The agent's exit never waits for the
helper's torch import: a helper that has not imported torch yet serves nothing, and is killed.
When the helper starts is the agent's choice (:mod:`elastic.agent.attempts`).
"""

from __future__ import annotations

import logging
import select
import socket
import subprocess
from typing import Mapping

from elastic.agent.errors import StoreHostError
from elastic.agent.pdeathsig import parent_death_preexec
from elastic.agent.processes.reaping import wait_exited
from elastic.agent.safe_path import isolated_program

log = logging.getLogger(__name__)

__all__ = ["StoreHost", "StoreHostError"]

_STOP_TIMEOUT_S = 2.0
"""How long a helper serving a store gets to exit after its pair closes, before it is killed."""

# The helper's program, run as ``python -c`` by the workers' interpreter (it may not have our
# package; it must have torch), without the agent's working directory on its path (safe_path). argv[1]: the fd of its end of the pair. Replies, one line each:
# "ready" once torch is imported, then per socket received "serving <port>" or "error <text>";
# the store it served before stays up as the previous one (the one before that closes); a
# message without a socket drops both. At EOF it drops them (their ports close) and leaves with
# os._exit: the interpreter's teardown of torch would hold the agent's exit for a few tenths of
# a second.
_HOST_PROGRAM = r"""
import os, socket, sys
from datetime import timedelta
chan = socket.socket(fileno=int(sys.argv[1]))
try:
    import torch.distributed as dist
except BaseException as error:
    chan.sendall(("error cannot import torch.distributed: %r" % (error,))[:300].encode())
    sys.exit(0)
chan.sendall(b"ready")
store = previous = None
while True:
    message, fds, _, _ = socket.recv_fds(chan, 256, 1)
    if not message:
        os._exit(0)
    if not fds:
        store = previous = None  # released: both stores stop, their ports close
        continue
    previous, store = store, None  # the one before the previous stops
    host, port = message.decode().split()
    try:
        store = dist.TCPStore(host, int(port), None, True, timedelta(seconds=60),
                              wait_for_workers=False, master_listen_fd=fds[0])
        chan.sendall(b"serving %d" % int(port))
    except BaseException as error:
        os.close(fds[0])
        chan.sendall(("error %r" % (error,))[:300].encode())
"""


class StoreHost:
    """One helper process per agent, started on first use, serving one attempt's store at a time
    (and the attempt's before, until the next hand-over).

    The hand-off never waits for the helper: workers start at once, and their connections
    queue on the listening socket until the helper serves it (its first start imports torch,
    in parallel with the workers' own imports). The helper's replies are read without blocking
    and its errors logged: a helper that cannot import torch serves workers that cannot either.

    Args:
        python: the workers' interpreter (it imports torch).
        environ: the helper's environment (the workers' base environment).
    """

    def __init__(self, python: str, environ: Mapping[str, str]) -> None:
        self._python = python
        self._environ = dict(environ)
        self._proc: subprocess.Popen | None = None
        self._chan: socket.socket | None = None
        self._ready = False  # the helper said it imported torch (it may serve a store from then on)
        self.serving: int | None = None
        """The port whose store the helper last confirmed serving (for tests and logs)."""

    @property
    def pid(self) -> int | None:
        """The helper's pid (None before it started or after it was closed)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def ready(self) -> bool:
        """Whether the helper said it imported torch (as of the last :meth:`poll`)."""
        return self._ready

    def warm(self) -> None:
        """Start the helper now (if it is not running), in the background, so it has imported
        torch by the time this node first hosts a store (the master moves to a survivor after a
        node loss).

        Raises nothing: a helper that cannot start is retried by :meth:`serve`.
        """
        try:
            self._ensure_started()
        except OSError as error:
            log.warning("Store helper: cannot start %s: %s", self._python, error)
            self.close()

    def serve(self, listener: socket.socket, host: str) -> None:
        """Hand ``listener`` (a listening socket, closed here whatever happens) to the helper.

        Raises:
            StoreHostError: the helper could not be started or reached; rank 0's worker must
                host the store itself.
        """
        port = listener.getsockname()[1]
        try:
            chan = self._ensure_started()
            self.poll()
            socket.send_fds(chan, [f"{host} {port}".encode()], [listener.fileno()])
        except OSError as error:
            self.close()
            raise StoreHostError(f"the store helper could not take port {port}: {error}") from error
        finally:
            listener.close()  # the helper holds its own copy now

    def release(self) -> None:
        """Stop serving the current attempt's store and the one before (their ports close); the
        helper stays warm."""
        if self._chan is None:
            return
        try:
            self.poll()
            self._chan.send(b"-")
        except OSError:
            self.close()

    def poll(self) -> None:
        """Read the helper's replies so far without blocking; log its errors.

        Raises:
            OSError: the helper exited.
        """
        chan = self._chan
        while chan is not None and select.select([chan], [], [], 0)[0]:
            reply = chan.recv(4096).decode(errors="replace").strip()
            if not reply:
                raise OSError("the store helper exited")
            if reply == "ready":
                self._ready = True
            elif reply.startswith("serving"):
                self.serving = int(reply.split()[1])
            elif reply.startswith("error"):
                log.warning("Store helper: %s", reply[len("error"):].strip())

    def close(self) -> None:
        """Stop the helper and reap it (idempotent); never waits for its torch import.

        A helper still importing torch serves nothing (a socket handed to it meanwhile waits
        unread): it is killed at once, so the agent's exit does not wait out the import. A helper
        that has imported torch may serve a store: it is told to stop (its end of the pair reads
        EOF, it drops the store and exits) and killed only if it has not within 2 s.
        """
        try:
            self.poll()  # a "ready" already sent counts
        except OSError:
            pass  # it exited: reaped below
        chan, self._chan = self._chan, None
        proc, self._proc = self._proc, None
        ready, self._ready = self._ready, False
        if proc is not None and not ready:
            proc.kill()  # mid-import, or failed to import: nothing of it is worth waiting for
        if chan is not None:
            chan.close()  # the helper reads EOF and exits
        if proc is not None and not wait_exited(proc, _STOP_TIMEOUT_S):
            proc.kill()
            proc.wait()

    def _ensure_started(self) -> socket.socket:
        if self._chan is not None and self._proc is not None and self._proc.poll() is None:
            return self._chan
        self.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message per send
        try:
            self._proc = subprocess.Popen(
                [self._python, "-c", isolated_program(_HOST_PROGRAM), str(theirs.fileno())],
                env=self._environ, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), start_new_session=True,
                preexec_fn=parent_death_preexec(),  # dies with the agent, even during its torch import
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        self._chan = ours
        return ours

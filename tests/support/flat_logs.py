"""A ``--logs-specs`` plugin for tests: a tiny distribution installed into a directory.

:func:`install_flat_logs` writes the module ``flatlogs`` and its ``flatlogs-0.1.dist-info``
(with ``entry_points.txt`` registering ``FlatLogsSpecs`` as ``flat`` in torchrun's
``torchrun.logs_specs`` group) into a directory; with that directory on ``PYTHONPATH``,
``importlib.metadata`` (torchrun's lookup, and elasticrun's) finds it.

``FlatLogsSpecs`` puts every rank's files in one flat directory, ``<log_dir>/flat/``, named
``<run_id>-r<restart_count>-<local_rank>.{out,err,error.json}``, tees like torch's default,
honours ``local_ranks_filter`` like it, and sets ``FLAT_LOGS=<local_rank>`` in each worker's
environment (torch passes the ``envs`` it gave ``reify`` to the workers).
"""

from __future__ import annotations

from pathlib import Path

ENTRY_POINT = "flat"

_MODULE = '''
import os
from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs, Std, to_map


class FlatLogsSpecs(LogsSpecs):
    @property
    def root_log_dir(self):
        return os.path.join(self._root_log_dir, "flat")

    def reify(self, envs):
        os.makedirs(self.root_log_dir, exist_ok=True)
        count = len(envs)
        redirects, tees = to_map(self._redirects, count), to_map(self._tee, count)
        dest = LogsDest({}, {}, {}, {}, {})
        for rank in range(count):
            env = envs[rank]
            base = os.path.join(self.root_log_dir, "%s-r%s-%d" % (
                env["TORCHELASTIC_RUN_ID"], env["TORCHELASTIC_RESTART_COUNT"], rank))
            shown = not self._local_ranks_filter or rank in self._local_ranks_filter
            for std, streams, tee_streams, suffix in ((Std.OUT, dest.stdouts, dest.tee_stdouts, ".out"),
                                                      (Std.ERR, dest.stderrs, dest.tee_stderrs, ".err")):
                to_file = (redirects[rank] | tees[rank]) & std
                streams[rank] = base + suffix if to_file else ("" if shown else os.devnull)
                if tees[rank] & std and shown:
                    tee_streams[rank] = streams[rank]
            dest.error_files[rank] = base + ".error.json"
            env["TORCHELASTIC_ERROR_FILE"] = dest.error_files[rank]
            env["FLAT_LOGS"] = str(rank)
        return dest
'''

_METADATA = "Metadata-Version: 2.1\nName: flatlogs\nVersion: 0.1\n"
_ENTRY_POINTS = f"[torchrun.logs_specs]\n{ENTRY_POINT} = flatlogs:FlatLogsSpecs\nbroken = flatlogs:NoSuchClass\n"


def install_flat_logs(directory: Path) -> Path:
    """Write the ``flatlogs`` distribution into ``directory`` (created if needed); returns it.

    Its entry points: ``flat`` (:data:`ENTRY_POINT`, the plugin) and ``broken`` (names a class
    that does not exist, for the load failure).
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "flatlogs.py").write_text(_MODULE)
    info = directory / "flatlogs-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(_METADATA)
    (info / "entry_points.txt").write_text(_ENTRY_POINTS)
    return directory

"""Wait until etcd accepts the job's connection settings, as elasticrun will use them.

Run by the worker pods' init container with elasticrun's own ``--rdzv-endpoint``, ``--rdzv-id``
and ``--rdzv-conf`` connection options (TLS files, user, password file, namespace). It parses them
as elasticrun does and connects as the agent does (``elastic.rendezvous.registry.open_backend``,
which reads a key of the run, ``<namespace>/<run id>/``, to check the endpoints and credentials:
a least-privilege user may read nothing else), so a pod starts its agent only once etcd is up,
its certificates verify and, with auth, its user exists and may use the run's keys.

Exit status: 0 connected; 1 not reachable within ``--timeout`` seconds (Kubernetes retries the
pod); 2 the settings are wrong and waiting will not help (a bad option or unreadable file).
"""

from __future__ import annotations

import argparse
import sys
import time

from elastic.rendezvous.errors import RendezvousConfigError, RendezvousConnectionError
from elastic.rendezvous.backend_spec import spec_from_conf
from elastic.rendezvous.conf import parse_rdzv_conf
from elastic.rendezvous.records import RendezvousKeys
from elastic.rendezvous.registry import open_backend
from elastic.rendezvous.settings import settings_from_conf

RETRY_INTERVAL = 2.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True, help="etcd endpoints, as --rdzv-endpoint")
    parser.add_argument("--conf", default="", help="connection options (and namespace=), as --rdzv-conf")
    parser.add_argument("--run-id", default="wait-for-etcd", help="the run id, as --rdzv-id (whose keys are read)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before giving up")
    args = parser.parse_args(argv)
    try:  # the keys and values elasticrun would accept, or exit 2 now
        conf = parse_rdzv_conf(args.conf)
        settings = settings_from_conf(args.run_id, 1, 1, conf)
        spec = spec_from_conf("etcd", args.endpoint, conf)
    except RendezvousConfigError as error:
        print(f"wait-for-etcd: the connection settings are wrong: {error}", file=sys.stderr)
        return 2
    started = time.monotonic()
    deadline = started + args.timeout
    attempt = 0
    while True:
        attempt += 1
        try:
            opened = open_backend(spec, keys=RendezvousKeys(settings.namespace, settings.run_id))
        except RendezvousConfigError as error:
            print(f"wait-for-etcd: the connection settings are wrong: {error}", file=sys.stderr)
            return 2
        except RendezvousConnectionError as error:
            if time.monotonic() >= deadline:
                print(f"wait-for-etcd: etcd at {args.endpoint} not usable after {time.monotonic() - started:.0f}s "
                      f"(--timeout {args.timeout:g}): {error}", file=sys.stderr)
                return 1
            if attempt == 1 or attempt % 5 == 0:
                print(f"wait-for-etcd: waiting for etcd at {args.endpoint} (attempt {attempt}): {error}", flush=True)
            time.sleep(min(RETRY_INTERVAL, max(0.0, deadline - time.monotonic())))
            continue
        opened.release()
        print(f"wait-for-etcd: etcd at {args.endpoint} is ready (attempt {attempt}).", flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main())

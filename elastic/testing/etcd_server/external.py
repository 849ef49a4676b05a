"""An etcd the tests did not start, described by environment variables; never stopped."""

from __future__ import annotations

import os
from typing import Any

from backends.etcd import EtcdConfig
from elastic.testing.etcd_server.server import ENV_MODE, ROOT_USER, EtcdServer, EtcdServerError, EtcdServerOptions


class ExternalEtcdServer(EtcdServer):
    """An etcd the tests did not start, described by environment variables; never stopped.

    Raises (from the constructor):
        EtcdServerError: ``ETCD_ENDPOINTS`` is unset, or the options ask for what it lacks.
    """

    mode = "external"

    def __init__(self, options: EtcdServerOptions = EtcdServerOptions(), environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ if environ is None else environ)
        self._endpoints = env.get("ETCD_ENDPOINTS", "").strip()
        if not self._endpoints:
            raise EtcdServerError(f"{ENV_MODE}=external needs ETCD_ENDPOINTS, e.g. 127.0.0.1:2379.")
        user, password = env.get("ETCD_USER"), env.get("ETCD_PASSWORD")
        if options.auth and not (user == ROOT_USER and password):
            raise EtcdServerError(
                f"This test needs an auth-enabled etcd: set ETCD_USER={ROOT_USER} and ETCD_PASSWORD for the "
                f"external etcd, or use {ENV_MODE}=binary."
            )
        if options.uses_tls and not env.get("ETCD_CA_CERT"):
            raise EtcdServerError(
                f"This test needs a TLS etcd: set ETCD_CA_CERT (and client cert/key), or use {ENV_MODE}=binary."
            )
        if options.max_request_bytes is not None:
            raise EtcdServerError(f"This test needs its own etcd flags; use {ENV_MODE}=binary.")
        super().__init__(EtcdServerOptions(auth=options.auth, password=password or options.password))
        self._extra = {
            name: env[variable]
            for name, variable in (
                ("ca_cert", "ETCD_CA_CERT"),
                ("client_cert", "ETCD_CLIENT_CERT"),
                ("client_key", "ETCD_CLIENT_KEY"),
            )
            if env.get(variable)
        }

    @property
    def endpoints(self) -> str:
        return self._endpoints

    def client_config(self, **overrides: Any) -> EtcdConfig:
        return super().client_config(**{**self._extra, **overrides})

    def close(self) -> None:
        """Nothing to stop: the tests did not start this etcd."""

"""A stand-in Kubernetes API server for the chart's ``lookup``, on loopback, in this process.

``helm template --dry-run=server`` asks the cluster of its ``--kubeconfig`` for what the
templates look up. The chart looks up one object, its worker StatefulSet (the run id's nonce is
an annotation on it), and helm's client needs only the ``apps/v1`` discovery document to find
it; everything else is answered 404 (Kubernetes' ``NotFound`` Status). Every request's path is
recorded in :attr:`FakeKubeApi.requests`.
"""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from typing import Any

_APPS_V1 = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "apps/v1", "resources": [
    {"name": "statefulsets", "singularName": "statefulset", "namespaced": True, "kind": "StatefulSet",
     "verbs": ["get", "list"]}]}
_NOT_FOUND = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}


class FakeKubeApi:
    """Serves ``statefulsets`` (``{(namespace, name): object}``) until :meth:`close`."""

    def __init__(self, statefulsets: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.statefulsets = statefulsets
        self.requests: list[str] = []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?")[0]
                api.requests.append(path)
                body, status = api.answer(path)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-kube-api", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def answer(self, path: str) -> tuple[dict[str, Any], int]:
        if path == "/apis/apps/v1":
            return _APPS_V1, 200
        parts = path.strip("/").split("/")
        if len(parts) == 7 and parts[:3] == ["apis", "apps", "v1"] and parts[3] == "namespaces" \
                and parts[5] == "statefulsets" and (parts[4], parts[6]) in self.statefulsets:
            return self.statefulsets[(parts[4], parts[6])], 200
        return _NOT_FOUND, 404

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig naming this server (no TLS, a dummy token)."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "not-a-secret"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
        return path

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

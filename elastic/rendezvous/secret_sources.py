"""Rendezvous secrets: a password or token given inline or in a file, and keeping inline ones
out of every process the agent starts.

A :class:`Secret` (``password=``, ``token=``) never shows in a repr, a log or ``--dry-run``; a
:class:`SecretFile` (``password_file=``, ``token_file=``) is read when the backend is opened, so
a rotated file is picked up by the next connection, and only when it is a small regular file.

An inline secret given in ``PET_RDZV_CONF`` used to reach every worker's environment. Once the
configuration is read, :func:`hide_inline_secrets` removes it from the agent's own environment
(so no helper or worker inherits it), and :func:`without_inline_secrets` from an environment
handed down explicitly. A secret on the command line is visible in ``ps`` to every user:
:func:`command_line_secret_warning` is the line that says so and points to ``*_file=``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, MutableMapping, Sequence, Union

from backends.untrusted import read_small_file
from elastic.rendezvous.conf import ConfValues, parse_rdzv_conf
from elastic.rendezvous.errors import RendezvousConfigError

__all__ = [
    "MAX_SECRET_FILE_BYTES", "RDZV_CONF_VARIABLE", "SECRET_OPTIONS", "Secret", "SecretFile", "SecretSource",
    "command_line_secret_warning", "hide_inline_secrets", "inline_secret_options", "secret_source",
    "without_inline_secrets",
]

MAX_SECRET_FILE_BYTES = 64 * 1024
"""Largest ``password_file``/``token_file`` read (a secret is a line; this refuses ``/dev/zero``)."""


@dataclass(frozen=True)
class Secret:
    """A password or token given inline (``password=``, ``token=``); its value is never shown."""

    option: str
    value: str = field(repr=False)

    def read(self) -> str:
        return self.value

    def conf_text(self) -> str:
        """How ``--dry-run`` shows it: ``password=***``."""
        return f"{self.option}=***"


@dataclass(frozen=True)
class SecretFile:
    """A password or token in a file (``password_file=``, ``token_file=``), read at each :meth:`read`."""

    option: str
    path: str

    def read(self) -> str:
        """The file's text without surrounding whitespace; only a regular file of at most
        :data:`MAX_SECRET_FILE_BYTES` is read, without blocking (a FIFO is refused, not waited on).

        Raises:
            RendezvousConfigError: the file cannot be read, is not a small regular UTF-8 file;
                the message names the option and the path.
        """
        try:
            return read_small_file(self.path, max_bytes=MAX_SECRET_FILE_BYTES).decode("utf-8").strip()
        except ValueError as error:  # UnicodeDecodeError included
            reason = "it is not UTF-8 text" if isinstance(error, UnicodeDecodeError) else str(error)
            raise RendezvousConfigError(f"Cannot read {self.option} {self.path[:200]!r}: {reason}.") from None

    def conf_text(self) -> str:
        return f"{self.option}={self.path}"


SecretSource = Union[Secret, SecretFile]


def secret_source(values: ConfValues, name: str) -> SecretSource | None:
    """``name`` inline, else ``<name>_file`` (the inline value wins when both are given)."""
    inline = values.text(name)
    if inline is not None:
        return Secret(name, inline)
    path = values.text(f"{name}_file")
    return SecretFile(f"{name}_file", path) if path is not None else None


SECRET_OPTIONS = ("password", "token")
"""``--rdzv-conf`` options whose value is a secret given inline (their ``*_file`` twins hold paths)."""

RDZV_CONF_VARIABLE = "PET_RDZV_CONF"
"""The environment twin of ``--rdzv-conf`` (torchrun's and ours): a carrier of inline secrets."""


def inline_secret_options(conf: Mapping[str, str]) -> tuple[str, ...]:
    """The secret options ``conf`` gives inline (``password``, ``token``), in that order."""
    return tuple(name for name in SECRET_OPTIONS if name in conf)


def command_line_secret_warning(options: Sequence[str]) -> str:
    """The one warning line for secrets given inline on the command line."""
    given = ", ".join(f"{name}=" for name in options)
    files = " or ".join(f"{name}_file=" for name in options)
    return (f"--rdzv-conf {given} puts a secret on the command line, where every user of this machine can read "
            f"it (ps, /proc/<pid>/cmdline); put it in a file only you can read and pass {files} instead")


def without_inline_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``environ`` whose ``PET_RDZV_CONF`` has no inline secret left: the secret
    entries are removed, the rest kept; the variable is dropped when nothing else is left or
    it cannot be parsed (then it may hold anything)."""
    env = dict(environ)
    text = env.get(RDZV_CONF_VARIABLE)
    if text is None:
        return env
    try:
        conf = parse_rdzv_conf(text)
    except RendezvousConfigError:
        del env[RDZV_CONF_VARIABLE]
        return env
    if inline_secret_options(conf):
        kept = ",".join(f"{key}={value}" for key, value in conf.items() if key not in SECRET_OPTIONS)
        if kept:
            env[RDZV_CONF_VARIABLE] = kept
        else:
            del env[RDZV_CONF_VARIABLE]
    return env


def hide_inline_secrets(environ: MutableMapping[str, str]) -> bool:
    """Remove inline secrets from ``environ`` in place (pass ``os.environ`` once the
    configuration is read, before any process starts); whether anything was removed."""
    clean = without_inline_secrets(environ)
    if clean.get(RDZV_CONF_VARIABLE) == environ.get(RDZV_CONF_VARIABLE):
        return False
    if RDZV_CONF_VARIABLE in clean:
        environ[RDZV_CONF_VARIABLE] = clean[RDZV_CONF_VARIABLE]
    else:
        del environ[RDZV_CONF_VARIABLE]
    return True



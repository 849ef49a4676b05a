"""Where each ``elasticrun`` flag's text comes from, and the parsers that turn it into values.

:class:`Sources` answers for one flag: the command line (the last one wins), else its ``PET_*``
twin (if set and not empty), else the flag table's default, with ``where`` naming it for
messages. The parsers raise :class:`ConfigError` with one line: ``--flag: 'text' is not ...``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from elastic.launch.flags import OPTIONS_BY_DEST, Option


class ConfigError(ValueError):
    """The command line or a ``PET_*`` variable is invalid; the message is one line naming it."""


@dataclass(frozen=True)
class Sources:
    """Where each flag's text comes from: the command line (last one wins), else its ``PET_*``
    twin (if set and not empty), else the table's default. ``where`` names it in messages."""

    command_line: Mapping[str, list[str]]
    environ: Mapping[str, str]

    def text(self, dest: str) -> tuple[str | None, str]:
        option = OPTIONS_BY_DEST[dest]
        if dest in self.command_line:
            return self.command_line[dest][-1], option.name
        from_env = self._from_env(option)
        if from_env is not None:
            return from_env, f"{option.name} (from {option.env_name})"
        return option.default, option.name

    def texts(self, dest: str) -> tuple[list[str], str]:
        """All values of a repeatable flag; the command line replaces the environment, as for any flag."""
        option = OPTIONS_BY_DEST[dest]
        if dest in self.command_line:
            return list(self.command_line[dest]), option.name
        from_env = self._from_env(option)
        if from_env is not None:
            return [from_env], f"{option.name} (from {option.env_name})"
        return ([option.default] if option.default else []), option.name

    def switch(self, dest: str) -> bool:
        text, where = self.text(dest)
        if text is None:
            return False
        return truth(text, where)

    def explicit(self, dest: str) -> bool:
        """Whether the user set this flag (on the command line or through its twin)."""
        return dest in self.command_line or self._from_env(OPTIONS_BY_DEST[dest]) is not None

    def _from_env(self, option: Option) -> str | None:
        if option.env_name is None:
            return None
        value = self.environ.get(option.env_name, "")
        return value if value.strip() else None


def as_given(sources: Sources, dest: str) -> str:
    """The setting as the user wrote it: ``--rdzv-id=job``, ``PET_RDZV_ID=job`` or ``--standalone``."""
    option = OPTIONS_BY_DEST[dest]
    text = sources.text(dest)[0]
    if dest not in sources.command_line:
        return f"{option.env_name}={text}"
    return f"{option.long_flag}={text}" if option.takes_value else option.name


# -- values ------------------------------------------------------------------------------------


def fail(where: str, problem: str) -> ConfigError:
    return ConfigError(f"{where}: {problem}")


def sentence_tail(error: Exception) -> str:
    """A foreign error's message, lower-cased at the start so it reads after ``--flag: ``."""
    text = " ".join(str(error).split())
    return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text


def truth(text: str, where: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    try:
        return int(lowered) != 0
    except ValueError:
        raise fail(where, f"{text!r} is not 1 or 0 (true or false)") from None


def integer(text: str | None, where: str, minimum: int, maximum: int | None = None) -> int:
    stripped = (text or "").strip()
    value = int(stripped) if re.fullmatch(r"[0-9]+", stripped) else None
    if value is None or value < minimum or (maximum is not None and value > maximum):
        bounds = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
        raise fail(where, f"{text!r} is not a whole number {bounds}")
    return value


def optional_port(text: str | None, where: str) -> int | None:
    if text is None or not text.strip():
        return None
    return integer(text, where, 1, 65535)


def seconds(text: str | None, where: str, *, zero_allowed: bool = False) -> float:
    try:
        value = float(text or "")
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_allowed):
        kind = "a number of seconds >= 0" if zero_allowed else "a positive number of seconds"
        raise fail(where, f"{text!r} is not {kind}")
    return value


def module_names(text: str | None, where: str) -> tuple[str, ...]:
    """``--prewarm-modules``: dotted module names, comma-separated, at least one."""
    names = tuple(name.strip() for name in (text or "").split(",") if name.strip())
    if not names:
        raise fail(where, "name at least one module, e.g. torch or torch,numpy")
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise fail(where, f"{name!r} is not a module name (dotted identifiers, e.g. torch.distributed)")
    return names


def choice(text: str | None, where: str, choices: Sequence[str]) -> str:
    if text not in choices:
        raise fail(where, f"{text!r} is not one of {', '.join(choices)}")
    return text


def optional_text(text: str | None) -> str | None:
    return text.strip() if text and text.strip() else None


def host_address(text: str | None) -> str | None:
    """An address as workers and sockets take it: an IPv6 literal without its URL brackets."""
    if text and text.startswith("[") and text.endswith("]"):
        return text[1:-1]
    return text

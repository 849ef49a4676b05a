"""Split an ``elasticrun`` command line into the launcher's flags and the training command.

The command line is split by hand rather than by argparse's ``REMAINDER``, which drops a ``--``
that follows the script: everything from the first word that is not a launcher flag (or that
follows a ``--``) is the training command and reaches the workers untouched. Before it, a long
flag may be abbreviated exactly as torchrun's argparse parser allows (``--nproc-per=2``,
``--max_re=3``; :func:`~elastic.launch.flags.flag_candidates`), and a flag's value is the next
word unless argparse would read that word as a flag. Errors are one line (:class:`ConfigError`).
"""

from __future__ import annotations

import difflib
import re
from typing import Sequence

import elastic
from elastic.launch.flags import HELP_FLAGS, OPTIONS_BY_FLAG, PROG, VERSION_FLAGS, flag_candidates, format_help
from elastic.launch.values import ConfigError


class HelpRequested(Exception):
    """``-h``/``--help`` was given; :attr:`text` is the help to print (the run stops with status 0)."""

    def __init__(self, text: str) -> None:
        super().__init__("help requested")
        self.text = text


def split_command_line(argv: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Separate the launcher's flags from the training command.

    Returns ``({dest: [text, ...]}, [script, *script_args])``; a switch given records ``"1"``.
    The command starts at the first word that is not a flag or a flag's value, or after ``--``.

    Raises:
        ConfigError: an unknown flag, a missing value, or a value given to a switch.
        HelpRequested: ``-h``/``--help`` (or ``--version``) appeared before the script.
    """
    given: dict[str, list[str]] = {}
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "--":
            return given, list(argv[index + 1:])
        if not word.startswith("-") or word == "-":
            return given, list(argv[index:])
        typed, value = _split_flag(word)
        flag = _resolve(typed)
        if flag in HELP_FLAGS + VERSION_FLAGS:
            if value is not None:
                raise ConfigError(f"{flag}: takes no value (got {value!r})")
            raise HelpRequested(format_help() if flag in HELP_FLAGS else f"{PROG} {elastic.__version__}\n")
        option = OPTIONS_BY_FLAG[flag]
        if not option.takes_value:
            if value is not None:
                raise ConfigError(f"{option.name}: a switch takes no value (got {value!r})")
            value = "1"
        elif value is None:
            following = argv[index + 1] if index + 1 < len(argv) else None
            if following is None or _reads_as_flag(following):
                raise ConfigError(f"{option.name}: expects a value ({option.metavar})")
            value = following
            index += 1
        given.setdefault(option.dest, []).append(value)
        index += 1
    return given, []


def _resolve(flag: str) -> str:
    """The flag ``flag`` names, abbreviations expanded as torchrun's parser expands them.

    Raises:
        ConfigError: an unknown flag, or an ambiguous abbreviation (naming what it could match).
    """
    candidates = flag_candidates(flag)
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise ConfigError(f"{flag}: unknown flag{_did_you_mean(flag)} (see {PROG} --help)")
    meant = list(dict.fromkeys(_long_name(candidate) for candidate in candidates))
    hint = meant[0] if len(meant) == 1 else f"one of {', '.join(meant)}"
    raise ConfigError(f"{flag}: ambiguous abbreviation, could match {', '.join(candidates)}; did you mean {hint}?")


def _long_name(flag: str) -> str:
    option = OPTIONS_BY_FLAG.get(flag)
    return option.long_flag if option is not None else flag


_NEGATIVE_NUMBER = re.compile(r"-[0-9]+|-[0-9]*\.[0-9]+")


def _reads_as_flag(word: str) -> bool:
    """Whether argparse reads ``word`` after a flag as another flag rather than its value: a flag
    or an abbreviation of one; else any ``-`` word but ``-``, a negative number or one with a space."""
    if not word.startswith("-") or word == "-":
        return False
    if flag_candidates(_split_flag(word)[0]):
        return True
    return not (_NEGATIVE_NUMBER.fullmatch(word) or " " in word)


def _split_flag(word: str) -> tuple[str, str | None]:
    """``--a=b`` -> (``--a``, ``b``); ``-r3`` / ``-r=3`` -> (``-r``, ``3``); ``--a`` -> (``--a``, None)."""
    if word.startswith("--"):
        flag, equals, value = word.partition("=")
        return flag, value if equals else None
    if len(word) > 2:
        return word[:2], word[3:] if word[2] == "=" else word[2:]
    return word, None


def _did_you_mean(flag: str) -> str:
    """A suggestion for a misspelt flag (one that abbreviates none)."""
    close = difflib.get_close_matches(flag, list(OPTIONS_BY_FLAG), n=1, cutoff=0.75)
    return f"; did you mean {_long_name(close[0])}?" if close else ""

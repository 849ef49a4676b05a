"""The pre-warm flags of ``elasticrun`` as :class:`~elastic.config.LaunchConfig` fields.

``--prewarm`` is off by default and on by default with ``--live-recovery``, where every crash or
join would otherwise cost the survivors a replacement's interpreter start and torch's import;
``--no-prewarm`` turns that default off. ``--prewarm-modules`` defaults to ``torch``, and with
``--live-recovery`` to :data:`~elastic.launch.flags.LIVE_PREWARM_MODULES`. ``--no-python``
workers are not Python, so no template serves them: prewarm is then off, with a warning only when
the user asked for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from elastic.config import Entrypoint
from elastic.launch.flags import LIVE_PREWARM_MODULES
from elastic.launch.values import ConfigError, Sources, as_given, module_names

__all__ = ["PrewarmAsked", "PrewarmChoice", "PrewarmConflict", "choose_prewarm", "prewarm_fields"]


@dataclass(frozen=True)
class PrewarmAsked:
    """What the user said about pre-warming, and what else decides it.

    Attributes:
        prewarm: ``--prewarm`` (or ``PET_PREWARM``) was given.
        no_prewarm: ``--no-prewarm`` (or ``PET_NO_PREWARM``) was given.
        modules: the ``--prewarm-modules`` the user gave; None when they gave none.
        live_recovery: the job runs with ``--live-recovery``.
        python: the workers are Python (not ``--no-python``).
    """

    prewarm: bool
    no_prewarm: bool
    modules: tuple[str, ...] | None
    live_recovery: bool
    python: bool


@dataclass(frozen=True)
class PrewarmChoice:
    """Whether workers are forked from templates, what the templates import, and whether the user
    must be told that the ``--prewarm`` they asked for is ignored (``--no-python``)."""

    on: bool
    modules: tuple[str, ...]
    ignored_ask: bool = False


class PrewarmConflict(ValueError):
    """``--prewarm`` and ``--no-prewarm`` were both given."""


def choose_prewarm(asked: PrewarmAsked) -> PrewarmChoice:
    """Pre-warm when asked, or by default with live recovery unless refused; never for
    ``--no-python`` workers. The user's modules win; else live recovery's, else ``torch``.

    Raises:
        PrewarmConflict: both ``--prewarm`` and ``--no-prewarm``.
    """
    if asked.prewarm and asked.no_prewarm:
        raise PrewarmConflict("--prewarm and --no-prewarm")
    default = LIVE_PREWARM_MODULES if asked.live_recovery else ("torch",)
    wanted = asked.prewarm or (asked.live_recovery and not asked.no_prewarm)
    return PrewarmChoice(on=wanted and asked.python, modules=asked.modules or default,
                         ignored_ask=asked.prewarm and not asked.python)


def prewarm_fields(sources: Sources, entrypoint: Entrypoint, live_recovery: bool,
                   warn: Callable[[str], None]) -> dict[str, Any]:
    """The pre-warm fields of :class:`LaunchConfig` (``prewarm``, ``prewarm_modules``).

    Raises:
        ConfigError: ``--prewarm`` with ``--no-prewarm`` (either from its ``PET_*`` twin), or a
            bad ``--prewarm-modules``.
    """
    given = module_names(*sources.text("prewarm_modules"))
    asked = PrewarmAsked(prewarm=sources.switch("prewarm"), no_prewarm=sources.switch("no_prewarm"),
                         modules=given if sources.explicit("prewarm_modules") else None,
                         live_recovery=live_recovery, python=entrypoint.kind != "command")
    try:
        choice = choose_prewarm(asked)
    except PrewarmConflict as conflict:
        raise ConfigError(f"{as_given(sources, 'prewarm')} and {as_given(sources, 'no_prewarm')} cannot be "
                          "used together: drop one (--live-recovery turns --prewarm on by itself)") from conflict
    if choice.ignored_ask:
        warn(f"{as_given(sources, 'prewarm')} is ignored with --no-python: the workers are not Python, so "
             "they start as usual")
    return {"prewarm": choice.on, "prewarm_modules": choice.modules}

"""``--dry-run``'s text: the resolved :class:`~elastic.config.LaunchConfig`, one ``key: value`` per line."""

from __future__ import annotations

import shlex

from elastic.config import LaunchConfig, StdMask
from elastic.rendezvous.settings import RendezvousSettings


def describe(config: LaunchConfig) -> str:
    """The resolved configuration, one ``key: value`` per line in a fixed order; secrets masked."""
    entry = config.entrypoint
    nodes = f"{config.min_nodes}" if config.min_nodes == config.max_nodes else f"{config.min_nodes}:{config.max_nodes}"
    nproc = str(config.nproc_per_node)
    if config.nproc_source and config.nproc_source != nproc:
        nproc += f" ({config.nproc_source})"
    rows = [
        ("entrypoint", f"{entry.kind} {shlex.join((entry.target, *entry.args))}"),
        ("nnodes", nodes + (" (elastic)" if config.min_nodes != config.max_nodes else "")),
        ("nproc_per_node", nproc),
        ("rdzv_backend", config.backend.name),
        ("rdzv_endpoint", config.backend.endpoint_text),
        ("run_id", config.run_id),
        ("standalone", _yes_no(config.standalone)),
        ("backend", config.backend.conf_text()),
        ("rendezvous", _settings_text(config.rendezvous)),
        ("local_addr", config.local_addr or "this host's name"),
        ("role", config.role),
        ("max_restarts", str(config.max_restarts)),
        ("monitor_interval", f"{config.monitor_interval:g}s"),
        ("start_method", config.start_method),
        ("log_dir", config.log_dir or "none"),
        ("redirects", _mask_text(config.redirects)),
        ("tee", _mask_text(config.tee)),
        ("local_ranks_filter", ",".join(map(str, sorted(config.local_ranks_filter)))
         if config.local_ranks_filter is not None else "all"),
        ("log_line_prefix_template", config.log_line_prefix_template or "[${role_name}${local_rank}]: (default)"),
        ("logs_specs", config.logs_specs or "none (the layout of --log-dir)"),
        ("signals_to_handle", ",".join(config.signals_to_handle)),
        ("shutdown_timeout", f"{config.shutdown_timeout:g}s"),
        ("exit_barrier_timeout", f"{config.exit_barrier_timeout:g}s"),
        ("metrics_port", str(config.metrics_port) if config.metrics_port else "off"),
        ("metrics_addr", config.metrics_addr),
        ("event_log", config.event_log or "off"),
        ("prewarm", _yes_no(config.prewarm)),
        ("prewarm_modules", ",".join(config.prewarm_modules) if config.prewarm else "none (no prewarm)"),
        ("live_recovery", _yes_no(config.live_recovery)),
        ("live_recovery_timeout", f"{config.live_recovery_timeout:g}s"),
        ("verbose", _yes_no(config.verbose)),
        ("dry_run", _yes_no(config.dry_run)),
    ]
    width = max(len(key) for key, _ in rows) + 1
    return "".join(f"{key + ':':<{width}} {value}\n" for key, value in rows)


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def _settings_text(settings: RendezvousSettings) -> str:
    """The engine's settings in ``--rdzv-conf`` form (run id and node range are shown above)."""
    return (f"join_timeout={settings.join_timeout:g},last_call_timeout={settings.last_call_timeout:g},"
            f"close_timeout={settings.close_timeout:g},lease_ttl={settings.lease_ttl:g},"
            f"namespace={settings.namespace},max_node_failures={settings.max_node_failures},"
            f"exclusion_cooldown={settings.exclusion_cooldown:g},store_outage_timeout={settings.store_outage_timeout:g}")


def _mask_text(mask: StdMask) -> str:
    """The mask in the flag's own syntax: ``3`` or ``0:1,1:2``."""
    if not mask.per_rank:
        return str(int(mask.default))
    return ",".join(f"{rank}:{int(std)}" for rank, std in sorted(mask.per_rank.items()))

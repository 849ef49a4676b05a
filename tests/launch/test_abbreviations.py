"""Abbreviated flags: elasticrun reads a word exactly as torchrun's own argparse parser does.

The reference is torch's parser itself (``torch.distributed.run.get_args_parser()``), run in this
process on the same words: what it accepts must set the same flag to the same value here; what
it refuses as ambiguous or unknown is refused here too, with one line and a suggestion.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import pytest

from elastic.launch.cli import ConfigError, HelpRequested, split_command_line
from elastic.launch.flags import OPTIONS, OWN_LONG_FLAGS, TORCHRUN_LONG_FLAGS, flag_candidates


def torch_reads(argv: list[str]) -> tuple:
    """What torchrun's parser makes of ``argv``: ("ok", {dest: text}, command), ("help",) or ("error", line)."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            namespace = parser.parse_args(argv)
    except SystemExit as exit_:
        return ("help",) if exit_.code == 0 else ("error", err.getvalue().strip().splitlines()[-1])
    values = {dest: _text(value) for dest, value in vars(namespace).items()
              if value != parser.get_default(dest) and not dest.startswith("training_script")}
    return "ok", values, [namespace.training_script, *namespace.training_script_args]


def _text(value: object) -> str:
    """A parsed value as it was typed: a switch as ``1``, a comma-separated list joined again."""
    if value is True:
        return "1"
    return ",".join(value) if isinstance(value, list) else str(value)


def ours_reads(argv: list[str]) -> tuple:
    try:
        given, command = split_command_line(argv)
    except HelpRequested:
        return ("help",)
    except ConfigError as error:
        return "error", str(error)
    return "ok", {dest: texts[-1] for dest, texts in given.items()}, command


ACCEPTED = [
    ["--redirect=3"], ["--redir", "3"], ["-r3"], ["-r=3"], ["--max_re=3"], ["--max-re=3"], ["--nproc-per=2"],
    ["--nproc_per", "2"], ["--nnod=2"], ["--nn", "2"], ["--stand"], ["--no-p"], ["--no_p"], ["--mod"],
    ["--rdzv-b=c10d"], ["--rdzv_e", "h:1"], ["--rdzv-i=j"], ["--rdzv-c=a=1"], ["--rdzv_conf", "a b"], ["--te=1"],
    ["--local-r=0"], ["--local_ranks=0,1"], ["--log-d=/tmp/x"], ["--logs-s=mine"], ["--master-a=h"],
    ["--master_p=1"], ["--node-r=1"], ["--monitor-=0.5"], ["--start-=fork"], ["--signals-=SIGUSR1"],
    ["--shutdown-t=5"], ["--virtual-"], ["--duplicate-stdout=a"], ["--event-l=console"], ["--event_=console"],
    ["--run-"], ["--numa-=node"], ["--ro=trainer"], ["--max-restarts", "-1"], ["--rdzv-id", "-"],
    ["--he"], ["--h"], ["--t=3"], ["--nproc-per=2", "--tee", "0:3", "--redirects=0:1"],
]
AMBIGUOUS = [
    ["--nproc=2"], ["--nproc", "2"], ["--n=2"], ["--rdzv=1"], ["--st"], ["--log=x"], ["--mo"], ["--max=3"],
    ["--master=x"], ["--local=0"], ["--no"], ["--start=fork"], ["--sig=SIGUSR1"], ["--shut=5"], ["--virt"],
    ["--dup=a"], ["--run"], ["--=3"], ["--e"], ["--r=3"], ["--monitor=1"],
]
REFUSED = [
    ["--bogus"], ["--nnodesx=2"], ["--rdzv-conff=x"], ["--nproc-per-nodes=2"], ["-x"], ["--rdzv-id", "--bogus"],
    ["--rdzv-conf", "--nproc-per=2"], ["--nnodes"], ["--nnodes", "--"], ["--standalone=1"],
]


@pytest.mark.parametrize("words", ACCEPTED + AMBIGUOUS + REFUSED, ids=lambda words: " ".join(words))
def test_a_word_means_what_it_means_to_torchruns_parser(words):
    argv = [*words, "train.py", "--lr", "1"]
    theirs, ours = torch_reads(argv), ours_reads(argv)
    assert theirs[0] == ours[0], (theirs, ours)
    if theirs[0] == "ok":
        assert ours[1:] == theirs[1:]
    elif theirs[0] == "error":
        assert "\n" not in ours[1] and any(says in ours[1] for says in (
            "did you mean", "unknown flag", "expects a value", "takes no value")), ours[1]
        if "ambiguous option" in theirs[1]:
            matches = set(theirs[1].split(" could match ")[1].split(", "))
            typed = words[0].split("=")[0]
            assert ours[1].startswith(f"{typed}: ambiguous abbreviation, could match ") and "; did you mean" in ours[1]
            assert set(ours[1].split(" could match ")[1].split(";")[0].split(", ")) == matches


def test_the_tables_cover_every_outcome():
    outcomes = {case: torch_reads([*case, "t.py"])[0] for case in map(tuple, ACCEPTED + AMBIGUOUS + REFUSED)}
    assert {outcomes[tuple(case)] for case in ACCEPTED} == {"ok", "help"}
    assert {outcomes[tuple(case)] for case in AMBIGUOUS + REFUSED} == {"error"}


def test_our_flag_table_has_exactly_torchruns_long_spellings_first():
    from torch.distributed.run import get_args_parser

    theirs = {flag for action in get_args_parser()._actions for flag in action.option_strings if flag[:2] == "--"}
    assert set(TORCHRUN_LONG_FLAGS) == theirs
    assert not set(OWN_LONG_FLAGS) & theirs


@pytest.mark.parametrize("flag, meaning", [
    ("--nproc-per", ("--nproc-per-node",)),
    ("--nproc", ("--nproc-per-node", "--nproc_per_node")),  # argparse counts spellings
    ("--event-l", ("--event-log-handler",)),  # torchrun's flag wins over our --event-log
    ("--event-log", ("--event-log",)),  # an exact flag is itself
    ("--exit", ("--exit-barrier-timeout", "--exit_barrier_timeout")),
    ("--exit-", ("--exit-barrier-timeout",)),
    ("--metrics-p", ("--metrics-port",)),
    ("--dry", ("--dry-run", "--dry_run")),
    ("--dry-", ("--dry-run",)),
    ("--vers", ("--version",)),
    ("--pre", ("--prewarm", "--prewarm-modules", "--prewarm_modules")),
    ("--no-p", ("--no-python",)),  # torchrun's flag wins over our --no-prewarm
    ("--no-pr", ("--no-prewarm",)),
    ("--bogus", ()),
    ("-x", ()),
    ("-m", ("-m",)),
])
def test_flag_candidates_prefer_torchruns_spellings_then_ours(flag, meaning):
    assert flag_candidates(flag) == meaning


def test_our_own_flags_abbreviate_too_where_torchrun_has_no_such_prefix():
    assert ours_reads(["--metrics-p=9100", "--dry-", "--exit-=5", "t.py"]) == (
        "ok", {"metrics_port": "9100", "dry_run": "1", "exit_barrier_timeout": "5"}, ["t.py"])


def test_words_after_the_script_are_never_read_as_flags_even_where_torchrun_refuses_them():
    # torchrun's argparse checks every word for ambiguity, the script's arguments included
    assert torch_reads(["train.py", "--nproc=3"])[0] == "error"
    assert ours_reads(["train.py", "--nproc=3", "--redirect=3"]) == ("ok", {}, ["train.py", "--nproc=3", "--redirect=3"])
    assert ours_reads(["--", "--nproc=3"]) == ("ok", {}, ["--nproc=3"])


def test_pet_twins_are_never_abbreviated():
    from elastic.launch.cli import config_from_args

    config = config_from_args(["t.py"], {"PET_NPROC": "4", "PET_NPROC_PER": "4"}, warn=lambda _: None)
    assert config.nproc_per_node == 1


def test_every_option_is_reachable_by_an_unambiguous_prefix_or_its_full_name():
    for option in OPTIONS:
        assert flag_candidates(option.long_flag) == (option.long_flag,)


def test_an_ambiguous_abbreviation_exits_2_with_one_line_and_a_suggestion():
    result = subprocess.run([sys.executable, "-m", "elastic.run", "--nproc=2", "train.py"], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("elasticrun: error: --nproc: ambiguous abbreviation, could match --nproc-per-node, "
                             "--nproc_per_node; did you mean --nproc-per-node?\n")

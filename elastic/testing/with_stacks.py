"""Run a module as ``python -m`` would, with every thread's stack dumped to stderr on SIGUSR1.

    python -m elastic.testing.with_stacks MODULE ARGS...

The chaos suite, the multinode harness and the torchrun-plugin tests start launchers through
this (:func:`command`), so an agent that never exits can be asked where it hangs before it is
killed (the launchers themselves are unchanged; neither handles SIGUSR1 unless told to).
"""

import faulthandler
import runpy
import signal
import sys


def command(module: str) -> list[str]:
    """The argv that runs ``module`` under this wrapper with this interpreter (append its arguments)."""
    return [sys.executable, "-m", "elastic.testing.with_stacks", module]


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

"""Workers die with their agent: the PID file and the watchdog, beside the parent-death signal
(:mod:`elastic.agent.pdeathsig`, below everything that starts a process)."""

"""Live recovery, the agent's side (``--live-recovery``): publish each new round to the running
workers over their round pipes, restart only those that died, and fall back to a whole-group
restart when a worker does not answer (:mod:`.decisions`, :mod:`.pipes`, :mod:`.workers`)."""

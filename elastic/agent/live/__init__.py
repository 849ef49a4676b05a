"""Live recovery, the agent's side: publish each new round to running workers, restart only the dead."""

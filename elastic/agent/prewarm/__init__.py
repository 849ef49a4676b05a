"""Pre-warmed worker templates (``--prewarm``): the agent's pool, the template program, the wire
between them, and the check that a template may be forked."""

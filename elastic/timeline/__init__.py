"""The timeline of a run: the event logs of every node drawn as one self-contained HTML page.

``elastic-timeline node-a.jsonl node-b.jsonl -o timeline.html`` (or ``python -m
elastic.timeline``, or ``elasticrun timeline``) gives a lane per machine (its agents one after
the other), the rendezvous waits, the training and the stalls as bars, restarts, live heals,
worker exits, lost members and endings as marks with their cause, the world size per round as a
step line, the job's downtime per fault and in total, a legend and a summary. Inline SVG and
CSS: no script and no network are needed to see it. Linear in the records (sorts aside).

One job per module, each usable alone:

* :mod:`~elastic.timeline.records`: lines to `Record` s, skipping what it cannot read, in
  bounded memory;
* :mod:`~elastic.timeline.rounds`: when each node's workers trained in each round, when the job
  did, and when a killed node died (pure);
* :mod:`~elastic.timeline.downtime`: the gaps between those spans, each charged to its fault (pure);
* :mod:`~elastic.timeline.machines`: agents (node ids) to machine lanes (pure);
* :mod:`~elastic.timeline.layout`: records to a `Timeline` (pure; what is drawn where in time);
* :mod:`~elastic.timeline.svg` and :mod:`~elastic.timeline.page`: a `Timeline` to SVG and HTML;
* :mod:`~elastic.timeline.cli`: the command.

It reads the event log's format (:mod:`elastic.agent.observe.events`) and imports nothing
else of the agent, and never torch.
"""

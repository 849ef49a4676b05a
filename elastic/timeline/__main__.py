"""``python -m elastic.timeline EVENTS.jsonl ... -o timeline.html`` (see :mod:`elastic.timeline.cli`)."""

import sys

from elastic.timeline.cli import main

sys.exit(main())

"""Another job's worker, for the scenarios where a second job reuses a run id: the probe under
another script name (another fingerprint), so its rows show whether it joined the first job."""

import sys

from probe import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

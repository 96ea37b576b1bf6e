"""Record README.md's fleet example (section "A fleet"): the test suite's fleet in a real
Prometheus, as tests/test_fleet_prometheus.py builds it (3 h of 24 replicas from
tests/fleet_history.py backfilled with promtool, and two live sidecars), and
``vllm-doctor fleet URL --since START --until END --step 60s`` against it. Prints the command and its output;
README.md shows them trimmed ("..." where lines are cut). Needs prometheus and promtool.

    .venv/bin/python tests/record_fleet_example.py
"""

from __future__ import annotations

import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from test_fleet_prometheus import cli, fleet_prometheus


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="vllm-doctor-fleet-") as tmp, fleet_prometheus(Path(tmp)) as prom:
        # the range on the history's minutes (its samples are 15 s apart from its start): the 60 s
        # steps then fall on samples, and a second run prints the same table (a range ending at
        # now takes, at each step, whichever sample precedes it: peaks shift from run to run)
        until = prom["start"] + 60 * math.ceil((time.time() - prom["start"]) / 60)
        argv = ["fleet", prom["url"], "--since", str(prom["start"]), "--until", str(until), "--step", "60s"]
        res = subprocess.run([cli(), *argv], capture_output=True, text=True, timeout=300)
    print("$ vllm-doctor " + " ".join(argv))
    print(res.stdout, end="")
    sys.stderr.write(res.stderr)
    return 0 if res.returncode in (0, 1, 2) else res.returncode


if __name__ == "__main__":
    sys.exit(main())

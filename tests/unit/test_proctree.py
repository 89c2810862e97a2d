"""The worker's check before it looks for a job's leftover processes: a process without
children has no descendants (as a subreaper, orphans come back to it as children), so the
/proc scan — milliseconds per job with a few hundred processes on the node — is skipped."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import subprocess
from jobfence.worker.proctree import has_children
seen = [has_children()]
p = subprocess.Popen(["sleep", "30"])
seen.append(has_children())
p.kill()
seen.append(has_children())  # exited, not yet reaped: still a child (and not reaped by us)
p.wait()
seen.append(has_children())
print(seen)
"""


def test_has_children_sees_live_and_unreaped_children_and_reaps_none() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[False, True, True, False]"

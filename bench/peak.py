"""Run a command and write its peak resident memory (kB, from wait4) to a file:

    python bench/peak.py OUTFILE CMD [ARG ...]

Why a launcher: Linux carries a process's peak RSS across fork and exec, so a child
forked straight from a large benchmark process would report the parent's size. This
launcher is small, so what it reports is the command's own peak. Standard library only.
"""

import os
import sys


def main() -> int:
    out, cmd = sys.argv[1], sys.argv[2:]
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(cmd[0], cmd)
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    with open(out, "w") as f:
        f.write(str(usage.ru_maxrss))
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())

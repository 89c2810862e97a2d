"""A hostile job's search for the keys: a Python script a job's command runs, which looks in
everything its process can read (its environment, every ``/proc/*/environ`` and ``cmdline``
it can open, every file under two directories) for connection strings, tries each one found
on the test's own server(s) only, and writes what it found and tried as JSON. The tests of
least privilege (tests/acceptance/test_least_privilege.py, test_command_sidecar.py) run it
and expect it to find nothing."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from tests.support import Dsn

SEARCH = r'''
import json, os, re, sys
from urllib.parse import urlsplit
report, cwd, home, aimed = sys.argv[1], sys.argv[2], sys.argv[3], set(sys.argv[4].split(","))
DSN = re.compile(rb"postgres(?:ql)?://[^\s\x00'\"]+|(?:host|dbname|user)=[^\x00]*?(?=\x00|$)")
found, seen, elsewhere = set(), [], set()

def server(dsn):
    """host:port a connection string points at ('' when it names neither)."""
    if "://" in dsn:
        try:
            u = urlsplit(dsn)
            return f"{u.hostname}:{u.port or 5432}"
        except ValueError:
            return ""
    kv = dict(re.findall(r"(host|port)=(\S+)", dsn))
    return f"{kv.get('host', '')}:{kv.get('port', '5432')}"

def scan(data, where):
    for m in DSN.findall(data):
        dsn = m.decode(errors="replace")
        if server(dsn) in aimed:
            found.add(dsn)
            seen.append(where)
        else:
            elsewhere.add(server(dsn))

scan("\0".join(f"{k}={v}" for k, v in os.environ.items()).encode(), "own environment")
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for part in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    scan(f.read(), f"/proc/{pid}/{part}")
            except OSError:
                pass
files = 0
for top in (cwd, home):
    for root, _, names in os.walk(top):
        for name in names:
            try:
                with open(os.path.join(root, name), "rb") as f:
                    scan(f.read(1 << 20), os.path.join(root, name))
                    files += 1
            except OSError:
                pass
tried = []
for dsn in sorted(found):
    try:
        import psycopg
        with psycopg.connect(dsn, connect_timeout=3, autocommit=True) as conn:
            for what, stmt in (
                ("mark another job succeeded",
                 "UPDATE jobfence.jobs SET status = 'succeeded' WHERE status = 'running'"),
                ("read another job's attempt_id", "SELECT attempt_id FROM jobfence.jobs"),
                ("claim a job", "SELECT * FROM jobfence.worker_claim('default', 'x', 60, 1)"),
                ("delete the audit trail", "DELETE FROM jobfence.job_events"),
                ("enqueue", "INSERT INTO jobfence.jobs (job_id, status, actions, max_attempts)"
                            " VALUES (gen_random_uuid(), 'pending', '[]', 3)"),
                ("drop a table", "DROP TABLE jobfence.job_events")):
                try:
                    conn.execute(stmt)
                    tried.append([what, "done"])
                except psycopg.Error as exc:
                    tried.append([what, type(exc).__name__])
    except Exception as exc:
        tried.append(["connect", type(exc).__name__])
with open(report, "w") as f:
    json.dump({"found": sorted(found), "where": seen, "tried": tried, "files": files,
               "elsewhere": sorted(elsewhere),
               "uid": os.getuid(), "env": sorted(os.environ)}, f)
'''


def servers(dsn: Dsn) -> str:
    """The ``host:port``s the test's database is reached at (directly, and through its
    pooler): the only servers the hostile search may try what it finds on."""
    urls = [dsn, getattr(dsn, "direct", "") or dsn]
    return ",".join(sorted({f"{d.get('host')}:{d.get('port') or 5432}"
                            for d in map(conninfo_to_dict, urls)}))

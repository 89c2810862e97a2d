"""Reconciliation over 1k and 10k worker pods: the real Kubernetes adapter pages through a
fake API server over HTTP (tests/kube_api.py: kmock with labelSelector and limit/continue),
the pods land in the pass's snapshot table page by page, and the database finds the dead
claims. Peak memory must stay flat as the pods grow (target < 150 MB); the baseline is
`python -c "import kubernetes, psycopg"`, what any such process pays."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import JOBFENCE, REPO, Bench, Section, peak_rss_mb
from devtools.kube_api import INSTALLATION, kube_api, pod_object
from devtools.sqlconn import connect

NAMESPACE = "jobs"
DEAD = 50


def kubeconfig(server: str, path: Path) -> None:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "bench", "user": {"token": "bench"}}],
        "contexts": [{"name": "bench", "context": {"cluster": "fake", "user": "bench",
                                                   "namespace": NAMESPACE}}]}))


def run(bench: Bench) -> Section:
    sizes = [1_000, 3_000] if bench.quick else [1_000, 10_000]
    s = Section("Reconciliation over many pods (peak memory)",
                "python -m bench.run --only reconciliation_memory",
                ["worker pods", "pass time", "pods/s", "peak RSS", "baseline", "vs baseline",
                 "dead claims reclaimed"])
    with tempfile.TemporaryDirectory() as tmp, kube_api() as api:
        config = Path(tmp) / "kubeconfig"
        kubeconfig(str(api.server.url).rstrip("/"), config)
        _, _, base, _, _ = peak_rss_mb([sys.executable, "-c", "import kubernetes, psycopg"],
                                       bench.env(""))
        listed = 0
        for n in sizes:
            for i in range(listed, n):
                api.put("v1/pods", NAMESPACE, pod_object(f"worker-{i:06d}",
                                                         namespace=NAMESPACE, job=f"w-{i}"))
            listed = n
            # The installation the fake pods are labelled with (reconciliation lists only
            # its own installation's pods).
            dsn = bench.database(migrated=False)
            subprocess.run([*JOBFENCE, "migrate"], env=bench.env(
                dsn, JOBFENCE_INSTALLATION=INSTALLATION), cwd=REPO, capture_output=True,
                check=True)
            with connect(dsn) as conn:  # live claims by pods that exist, and dead ones
                conn.execute("""
                    INSERT INTO jobs (job_id, status, actions, max_attempts, attempt_count,
                                      attempt_id, claimed_by, claimed_at, visible_at)
                    SELECT gen_random_uuid(), 'running', '[]', 3, 1, gen_random_uuid(),
                           CASE WHEN i <= %(dead)s THEN 'gone-' || i
                                ELSE 'worker-' || lpad((i * 7 %% %(n)s)::text, 6, '0') END,
                           now() - interval '10 minutes', now() + interval '1 hour'
                    FROM generate_series(1, %(claims)s) AS i""",
                             {"dead": DEAD, "n": n, "claims": DEAD + 200})
            env = bench.env(dsn, JOBFENCE_CLUSTER="kubernetes", KUBECONFIG=str(config),
                            JOBFENCE_NAMESPACE=NAMESPACE, KUBERNETES_SERVICE_HOST="")
            code, secs, mb, out, err = peak_rss_mb([*JOBFENCE, "reconciliation"], env)
            if code != 0:
                raise RuntimeError(err.decode()[-2000:])
            report = json.loads(out)
            assert report["pods_listed"] == n, report
            s.rows.append([f"{n:,}", f"{secs:.2f} s", f"{n / secs:,.0f}", f"{mb:.0f} MB",
                           f"{base:.0f} MB", f"{mb / base:.2f}×",
                           f"{report['missing_pods_detected']} of {DEAD}"])
    s.notes.append("Pages of 500 pods (`JOBFENCE_KUBE_PAGE_SIZE`); the pass time includes "
                   "the process start and the fake API server's own cost.")
    return s

"""The example action plugin examples/pg_maintenance, installed as pip would install it from
its pyproject.toml, as its users meet it: a job for a table that does not exist, or whose
resource is not the table it maintains, is refused at enqueue — exit 2 from the CLI, 400
from the HTTP API, ``jobfence.InvalidSpec`` from the Python API inside the application's
own transaction — and nothing is written; a lookup that cannot reach its database is exit 4;
a job for a table that exists is queued and a worker runs it against that table."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import jobfence
from devtools.sqlconn import connect
from tests.support import REPO, role_dsn, run_cli
from tests.support.factories import plugin_installed
from tests.support.procs import FAST, job, wait_for
from tests.support.serving import serve

EXAMPLE = REPO / "examples" / "pg_maintenance"


def installed(where: Path) -> Path:
    """The example as pip installs it: its module beside a dist-info whose entry points are
    its pyproject.toml's."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    info = where / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\n"
                                   f"Version: {project['version']}\n")
    lines = [f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in eps.items())
             for group, eps in project["entry-points"].items()]
    (info / "entry_points.txt").write_text("\n".join(lines))
    for module in EXAMPLE.glob("*.py"):
        (where / module.name).write_text(module.read_text())
    return where


@pytest.fixture
def env(dsn: str, tmp_path: Path) -> dict[str, str]:
    """The CLI's environment with the plugin installed, maintaining the test's database
    (its table shop.orders exists)."""
    with connect(dsn) as conn:
        conn.execute("CREATE SCHEMA shop")
        conn.execute("CREATE TABLE shop.orders (id int)")
        conn.execute("INSERT INTO shop.orders SELECT generate_series(1, 100)")
    return {"PYTHONPATH": str(installed(tmp_path / "site")),
            "PG_MAINTENANCE_DATABASE_URL": str(dsn)}


def action(table: str, operation: str = "analyze") -> str:
    return "pg-maintenance:" + json.dumps({"table": table, "operation": operation})


def nothing_written(dsn: str) -> bool:
    with connect(dsn) as conn:
        row = conn.execute("SELECT (SELECT count(*) FROM jobs) AS jobs, "
                           "(SELECT count(*) FROM job_events) AS events").fetchone()
    return row == {"jobs": 0, "events": 0}


def refused(r: Any, code: int = 2) -> str:
    assert r.returncode == code, r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith("jobfence: error: ")
    return str(line)


def test_the_cli_refuses_a_table_that_does_not_exist_and_writes_nothing(
        dsn: str, env: dict[str, str]) -> None:
    line = refused(run_cli(dsn, "enqueue", action("shop.nope"), "--resource", "shop.nope",
                           **env))
    assert line == ("jobfence: error: spec: resource 'shop.nope': action 'pg-maintenance': "
                    "table shop.nope does not exist in the maintained database")
    line = refused(run_cli(dsn, "enqueue", action("shop.orders"), "--resource", "shop.other",
                           **env))
    assert "must be the table it maintains, shop.orders" in line
    line = refused(run_cli(dsn, "enqueue", action("shop.orders"), **env))
    assert "spec: no resource: action 'pg-maintenance'" in line
    specs = [{"actions": [{"name": "pg-maintenance", "params": {"table": t}}], "resource": t}
             for t in ("shop.orders", "shop.gone")]
    line = refused(run_cli(dsn, "enqueue", "--spec", "-", input=json.dumps(specs), **env))
    assert line.startswith("jobfence: error: spec #1: resource 'shop.gone'")
    unreachable = {**env, "PG_MAINTENANCE_DATABASE_URL": "postgresql://127.0.0.1:1/none"}
    line = refused(run_cli(dsn, "enqueue", action("shop.orders"), "--resource", "shop.orders",
                           **unreachable), code=4)
    assert "cannot look shop.orders up" in line
    assert nothing_written(dsn)


def test_a_job_for_a_table_that_exists_is_queued_and_run(dsn: str, env: dict[str, str]) -> None:
    r = run_cli(dsn, "enqueue", action("shop.orders", "vacuum"), "--resource", "shop.orders",
                **env)
    assert r.returncode == 0, r.stderr
    job_id = json.loads(r.stdout)["job_id"]
    r = run_cli(dsn, "worker", **FAST, **env)
    assert r.returncode == 0, r.stderr
    assert job(dsn, job_id)["status"] == "succeeded"
    with connect(dsn) as conn:
        [result] = conn.execute("SELECT result FROM job_action_results WHERE job_id = %s",
                                (job_id,)).fetchall()
        assert result["result"] == {"operation": "vacuum", "table": "shop.orders"}

        def vacuumed() -> bool:
            row = conn.execute("SELECT last_vacuum FROM pg_stat_user_tables WHERE "
                               "schemaname = 'shop' AND relname = 'orders'").fetchone()
            return row is not None and row["last_vacuum"] is not None

        wait_for(vacuumed, timeout=10)


def test_the_http_api_answers_400_and_writes_nothing(dsn: str, env: dict[str, str],
                                                      tmp_path: Path) -> None:
    bad = {"actions": [{"name": "pg-maintenance", "params": {"table": "shop.nope"}}],
           "resource": "shop.nope"}
    with serve(dsn, JOBFENCE_AUTH="none", TMPDIR=str(tmp_path), **env) as server:
        r = server.post("/api/v1/jobs", bad)
        assert r.status == 400, r.body
        assert r.body == {"error": "spec: resource 'shop.nope': action 'pg-maintenance': "
                                   "table shop.nope does not exist in the maintained database"}
        assert nothing_written(dsn)
        good = {**bad, "actions": [{"name": "pg-maintenance",
                                    "params": {"table": "shop.orders"}}],
                "resource": "shop.orders"}
        r = server.post("/api/v1/jobs", good)
        assert r.status == 202, r.body


@pytest.fixture
def in_process(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The plugin installed in this process, as an application that enqueues would have it."""
    monkeypatch.setenv("PG_MAINTENANCE_DATABASE_URL", env["PG_MAINTENANCE_DATABASE_URL"])
    with plugin_installed(Path(env["PYTHONPATH"])):
        yield


@pytest.mark.usefixtures("in_process")
def test_the_python_api_raises_invalid_spec_and_the_transaction_goes_on(dsn: str) -> None:
    with psycopg.connect(role_dsn(dsn, "enqueue"), autocommit=True) as app, \
            connect(dsn) as admin:
        admin.execute("CREATE TABLE public.requests (id int)")
        admin.execute("GRANT INSERT, SELECT ON public.requests TO PUBLIC")
        with app.transaction():
            app.execute("INSERT INTO public.requests VALUES (1)")
            with pytest.raises(jobfence.InvalidSpec, match=r"table shop\.nope does not exist"):
                jobfence.enqueue(app, {"actions": [{"name": "pg-maintenance",
                                                    "params": {"table": "shop.nope"}}],
                                       "resource": "shop.nope"})
            [made] = jobfence.enqueue(app, {"actions": [{"name": "pg-maintenance",
                                                         "params": {"table": "shop.orders"}}],
                                            "resource": "shop.orders"})
        assert admin.execute("SELECT count(*) AS n FROM public.requests").fetchone() == {"n": 1}
        assert job(dsn, made["job_id"])["resource"] == "shop.orders"
        assert admin.execute("SELECT count(*) AS n FROM jobs").fetchone() == {"n": 1}

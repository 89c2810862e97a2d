"""The console in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
driven by Selenium), against a real ``jobfence serve`` and real workers: see a queue's depth,
open a failed job and read its error and output tail, retry it and watch it succeed without
reloading, pause a queue, cancel a running job and see its worker's child gone; what a job
runs (argv, env masked, revealed on request), an open output block and a text selection
that survive the refresh, a bulk retry and its confirmation, a schedule created and
paused, the queue chart.

Screenshots of each page go to ``JOBFENCE_SCREENSHOTS`` when set (``make screenshots``
writes docs/console/ with it), else to the test's temporary folder."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import role_dsn, run_cli
from tests.support.kube import ControlPlane
from tests.support.procs import FAST, alive, enqueue, job, kill_quietly, read_pid, spawn, wait_for
from tests.support.serving import Served, serve

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                reason="chromium and chromium-driver are not installed")


@pytest.fixture
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1360,900", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(DRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def console(dsn: str, tmp_path: Path) -> Iterator[Served]:
    with serve(dsn, JOBFENCE_AUTH="none", JOBFENCE_CLUSTER="local", TMPDIR=str(tmp_path),
               JOBFENCE_LOCAL_FUNCTIONS_DATABASE_URL=role_dsn(dsn, "sweeper")) as s:
        yield s


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("JOBFENCE_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def until(driver: Any, css: str, text: str | None = None, timeout: float = 20) -> Any:
    """The first element matching ``css`` (holding ``text``, when given), once it shows."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def found() -> Any:
        try:
            for e in driver.find_elements(By.CSS_SELECTOR, css):
                if text is None or text in e.text:
                    return e
        except StaleElementReferenceException:  # the page refreshed under us
            return None
        return None

    return wait_for(found, timeout=timeout, interval=0.1)


def click(driver: Any, css: str, text: str | None = None) -> None:
    from selenium.common.exceptions import StaleElementReferenceException

    def clicked() -> bool:
        try:
            until(driver, css, text).click()
            return True
        except StaleElementReferenceException:
            return False

    wait_for(clicked, timeout=20, interval=0.1)


def test_operating_through_the_console(browser: Any, console: Served, dsn: str,
                                       tmp_path: Path, shots: Path) -> None:
    # Work in two queues, and a job that fails the first time with output on both streams.
    for _ in range(3):
        enqueue(dsn, 'sleep:{"seconds": 0}', "--queue", "reports", "--label", "team=data")
    mark = tmp_path / "fixed"
    flaky = json.dumps({"argv": ["sh", "-c", f"echo loading rows; echo 'bad row 17: "
                                 f"not a date' >&2; test -e {mark} || exit 3"]})
    failed = enqueue(dsn, f"command:{flaky}", "--max-attempts", "1", "--resource", "db.sales",
                     "--label", "team=sales")
    assert run_cli(dsn, "worker", **FAST).returncode == 1
    assert job(dsn, failed)["status"] == "failed"

    # Queues: the depth of each queue.
    browser.get(console.url + "/#/queues")
    row = until(browser, "#queues tr[data-queue=reports]")
    assert row.find_element("css selector", ".depth").text == "3"
    browser.save_screenshot(str(shots / "queues.png"))

    # The failed job: its error, its output tails, who claimed it and why it ended.
    browser.get(console.url + f"/#/jobs/{failed}")
    until(browser, "#job-facts dd[data-fact=status]", "failed")
    until(browser, "#actions .error", "exit")
    click(browser, "#actions details.tail summary", "stdout")  # folded: not why it failed
    assert "loading rows" in until(browser, "#actions pre.tail-stdout").text
    assert "bad row 17: not a date" in until(browser, "#actions pre.tail-stderr").text
    assert "exit 3" in until(browser, "#actions .exit").text
    until(browser, "#attempts td", "failed")
    browser.save_screenshot(str(shots / "job-failed.png"))

    # Retry it, and watch it succeed while the page refreshes by itself.
    mark.touch()
    click(browser, "#retry-job")
    click(browser, "#confirm-ok")  # every retry and cancel asks first
    until(browser, "#job-facts dd[data-fact=status]", "pending")
    worker = spawn(dsn, "worker", "--max-jobs", "1")
    try:
        until(browser, "#job-facts dd[data-fact=status]", "succeeded", timeout=30)
    finally:
        kill_quietly(worker)
    until(browser, "#events", "retried by local")
    browser.save_screenshot(str(shots / "job-succeeded.png"))

    # Jobs: filtered by a label, found by the search box.
    browser.get(console.url + "/#/jobs?label=team%3Ddata")
    until(browser, "#jobs tbody tr")
    assert len(browser.find_elements("css selector", "#jobs tbody tr")) == 3
    browser.save_screenshot(str(shots / "jobs.png"))
    box = until(browser, "#search-input")
    box.send_keys(failed + "\n")
    until(browser, "#job-id", failed)

    # Pause a queue: the database says so, and the page shows it.
    browser.get(console.url + "/#/queues")
    click(browser, "#queues tr[data-queue=reports] button[data-action=pause]")
    until(browser, "#queues tr[data-queue=reports] .state", "paused")
    status = json.loads(run_cli(dsn, "queue", "status", "reports", "-o", "json").stdout)
    assert status["paused"] is True
    assert run_cli(dsn, "worker", "--queue", "reports", **FAST).returncode == 0
    assert json.loads(run_cli(dsn, "queue", "status", "reports", "-o", "json").stdout)[
        "pending"] == 3  # nothing claimed from a paused queue
    click(browser, "#queues tr[data-queue=reports] button[data-action=limit]")
    until(browser, "#confirm-input").send_keys("2")
    click(browser, "#confirm-ok")
    until(browser, "#queues tr[data-queue=reports] td.num", "2")
    assert json.loads(run_cli(dsn, "queue", "status", "reports", "-o", "json").stdout)[
        "limit"] == 2

    # Groups: a tenant's job in the queue, each tenant limited and served in turn.
    enqueue(dsn, 'sleep:{"seconds": 0}', "--queue", "reports", "--group", "acme")
    assert run_cli(dsn, "queue", "limit", "reports", "1", "--per-group").returncode == 0
    assert run_cli(dsn, "queue", "fair", "reports", "on").returncode == 0
    browser.get(console.url + "/#/queues")
    until(browser, "#queues tr[data-queue=reports] .state", "fair")
    until(browser, "#queues tr[data-queue=reports] td.num", "1 a group")
    until(browser, "#groups section[data-queue=reports] tbody", "acme")
    until(browser, "#groups section[data-queue=reports] tbody", "(no group)")
    browser.save_screenshot(str(shots / "queue-groups.png"))

    # Cancel a running job: its worker stops it, and the child is gone.
    pidfile = tmp_path / "child.pid"
    long = json.dumps({"argv": ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"]})
    running = enqueue(dsn, f"command:{long}")
    worker = spawn(dsn, "worker", "--max-jobs", "1")
    try:
        child = read_pid(pidfile)
        assert alive(child)
        browser.get(console.url + f"/#/jobs/{running}")
        until(browser, "#job-facts dd[data-fact=status]", "running")
        browser.save_screenshot(str(shots / "job-running.png"))
        click(browser, "#cancel-job")
        until(browser, "#confirm-message", "stopped within a second")
        click(browser, "#confirm-ok")
        until(browser, "#job-facts dd[data-fact=status]", "cancelled")
        wait_for(lambda: not alive(child), timeout=15)
        assert worker.wait(timeout=30) == 1
    finally:
        kill_quietly(worker)

    # Functions: health and runs; a manual trigger asks why, and is recorded.
    browser.get(console.url + "/#/functions")
    until(browser, "#functions tr[data-function=sweeper]")
    click(browser, "#functions tr[data-function=sweeper] button[data-action=trigger]")
    until(browser, "#confirm-reason").send_keys("checking leases after the deploy")
    click(browser, "#confirm-ok")
    until(browser, "#triggers", "checking leases after the deploy")
    until(browser, "#runs", "sweeper", timeout=40)
    browser.save_screenshot(str(shots / "functions.png"))

    # The drain switch.
    click(browser, "#drain-toggle")
    click(browser, "#confirm-ok")
    until(browser, "#drain", "draining")
    assert run_cli(dsn, "enqueue", 'sleep:{"seconds": 0}').returncode == 4


def test_a_parent_and_its_children(browser: Any, console: Served, dsn: str,
                                   s3_env: dict[str, str], shots: Path) -> None:
    from jobfence.adapters.s3 import S3ObjectStore

    store, bucket = S3ObjectStore(endpoint_url=s3_env["JOBFENCE_S3_ENDPOINT_URL"]), \
        s3_env["JOBFENCE_S3_BUCKET"]
    for i in range(6):
        store.put_bytes(bucket, f"in/part-{i}.txt", f"row {i}\n".encode())
    upper = ('for f in "$JOBFENCE_INPUT_DIR"/*; do tr a-z A-Z < "$f" > '
             '"$JOBFENCE_OUTPUT_DIR/$(basename "$f" .txt).out"; done')
    spec = {"actions": [{"name": "command", "params": {"argv": ["sh", "-c", upper]}}],
            "inputs": f"s3://{bucket}/in/", "labels": {"export": "daily"}}
    r = run_cli(dsn, "enqueue", "--spec", "-", input=json.dumps(spec), **s3_env)
    parent = json.loads(r.stdout)["job_id"]
    assert run_cli(dsn, "worker", "--max-jobs", "2", **{**FAST, **s3_env}).returncode == 0

    browser.get(console.url + f"/#/jobs/{parent}")
    until(browser, "#children p", "2 of 6 done")
    browser.save_screenshot(str(shots / "parent.png"))
    assert run_cli(dsn, "worker", "--max-jobs", "10", **{**FAST, **s3_env}).returncode == 0
    try:
        until(browser, "#children p", "6 of 6 done", timeout=30)  # refreshed by itself
    except AssertionError:
        raise AssertionError(browser.find_element("css selector", "#view").text) from None
    assert run_cli(dsn, "export-finalize", **s3_env).returncode == 0
    until(browser, "#job-facts dd[data-fact=status]", "succeeded")
    assert "s3://" in until(browser, "#job-facts dd[data-fact=manifest]").text

    # Its children: listed by the link, each with its outputs.
    click(browser, "#children a")
    until(browser, "#jobs tbody tr")
    assert len(browser.find_elements("css selector", "#jobs tbody tr")) == 6
    click(browser, "#jobs tbody tr a")
    assert ".out" in until(browser, "#actions .outputs").text


def test_signing_in_with_a_token_and_reading_only(browser: Any, dsn: str, tmp_path: Path,
                                                  kube: ControlPlane, namespace: str) -> None:
    """With a real ServiceAccount token, reviewed by the real API server."""
    from tests.support.kube import kubeconfig_for, service_account, token

    enqueue(dsn, 'sleep:{"seconds": 0}', "--queue", "reports")
    service_account(kube, namespace, "console", cluster_role="system:auth-delegator")
    service_account(kube, namespace, "viewer")
    viewer = token(kube, namespace, "viewer")
    kubeconfig = kubeconfig_for(kube, namespace, "console", tmp_path / "kubeconfig")
    with serve(dsn, JOBFENCE_AUTH="tokenreview", JOBFENCE_CLUSTER="kubernetes",
               JOBFENCE_NAMESPACE=namespace, JOBFENCE_AUTH_OPERATORS="group:ops",
               KUBECONFIG=str(kubeconfig)) as s:
        browser.get(s.url + "/#/queues")
        # No token yet: the console asks for one, once its first call was refused (the
        # box is in the page from the start, hidden until then).
        assert wait_for(lambda: until(browser, "#login-token").is_displayed(), timeout=10)
        box = until(browser, "#login-token")
        box.send_keys("wrong")
        click(browser, "#login-form button")
        wait_for(lambda: until(browser, "#login-token").is_displayed(), timeout=10)
        box = until(browser, "#login-token")
        box.clear()
        box.send_keys(viewer)
        click(browser, "#login-form button")
        until(browser, "#who", f"system:serviceaccount:{namespace}:viewer (reader)")
        row = until(browser, "#queues tr[data-queue=reports]")
        assert row.find_element("css selector", ".depth").text == "1"
        # A reader sees no operator's buttons, and the drain switch is not offered.
        buttons = row.find_elements("css selector", "button")
        assert buttons and not any(b.is_displayed() for b in buttons)
        assert not browser.find_elements("css selector", "#drain-toggle")


def _errors(browser: Any) -> list[str]:
    """What the page's scripts reported: uncaught errors and refusals by the page's own
    Content-Security-Policy (an API call answered 4xx is the page's business, not one)."""
    return [e["message"] for e in browser.get_log("browser")
            if e["level"] == "SEVERE" and "/api/v1/" not in e["message"]]


def _refreshed(browser: Any, times: int = 2) -> None:
    """Wait until the page has refreshed itself ``times`` more times."""
    seen = browser.execute_script("return document.getElementById('view').dataset.loadedAt")
    for _ in range(times):
        seen = wait_for(lambda s=seen: (v := browser.execute_script(
            "return document.getElementById('view').dataset.loadedAt")) != s and v,
            timeout=15)


def test_the_second_day_in_the_console(browser: Any, console: Served, dsn: str,
                                       shots: Path) -> None:
    from devtools.sqlconn import connect

    secret = "tok-4be1-never-on-screen"
    cmd = json.dumps({"argv": ["sh", "-c", "seq 1 40; echo done"],
                      "env": {"API_TOKEN": secret, "REGION": "eu-north-1"}})
    ran = enqueue(dsn, f"command:{cmd}", "--queue", "reports")
    assert run_cli(dsn, "worker", "--queue", "reports", **FAST).returncode == 0

    # What the job runs: its argv, its env's names with the values masked.
    browser.get(console.url + f"/#/jobs/{ran}")
    until(browser, "#actions code.argv", "sh -c 'seq 1 40; echo done'")
    env = until(browser, "#actions .env")
    assert "API_TOKEN" in env.text and "<masked>" in env.text and secret not in env.text
    assert secret not in browser.page_source
    browser.save_screenshot(str(shots / "job-params.png"))

    # An output block opened, and a selection in it, survive the refreshes.
    click(browser, "#actions details.tail summary", "stdout")
    pre = until(browser, "#actions pre.tail-stdout")
    browser.execute_script("const r = document.createRange(); r.selectNodeContents("
                           "arguments[0]); const s = getSelection(); s.removeAllRanges(); "
                           "s.addRange(r);", pre)
    _refreshed(browser)
    assert browser.execute_script("return document.querySelector("
                                  "'#actions details.tail').open") is True
    assert "done" in browser.execute_script("return getSelection().toString()")
    assert until(browser, "#actions pre.tail-stdout") == pre  # the same node, not a copy
    browser.save_screenshot(str(shots / "job-output-open.png"))

    # The values, for an operator who says why: recorded.
    click(browser, "#actions button[data-action=reveal-env]")
    until(browser, "#confirm-reason").send_keys("checking the region")
    click(browser, "#confirm-ok")
    until(browser, "#actions .env code.revealed", secret)
    with connect(dsn) as conn:
        row = conn.execute("SELECT actor, action FROM control_events").fetchone()
    assert row == {"actor": "local", "action": "env_revealed"}

    # A bulk retry of what failed last night: the confirmation names the count.
    failed = [enqueue(dsn, f"command:{cmd}", "--label", "batch=nightly") for _ in range(12)]
    with connect(dsn) as conn:
        conn.execute("UPDATE jobs SET status = 'failed', finished_at = now(), error = 'exit 1' "
                     "WHERE job_id = ANY(%s::uuid[])", (failed,))
    browser.get(console.url + "/#/jobs?status=failed&label=batch%3Dnightly")
    until(browser, "#jobs tbody tr")
    click(browser, "#bulk-retry")
    title = until(browser, "#confirm h2", "Retry 12 jobs")
    assert "status=failed" in title.text and "label=batch=nightly" in title.text
    until(browser, "#confirm-reason").send_keys("the upstream is back")
    browser.save_screenshot(str(shots / "bulk-retry-confirm.png"))
    click(browser, "#confirm-ok")
    until(browser, "#flash", "retried 12 jobs")
    with connect(dsn) as conn:
        reasons = conn.execute("SELECT reason FROM job_events WHERE from_status = 'failed' "
                               "AND to_status = 'pending'").fetchall()
    assert [r["reason"] for r in reasons] == [
        "retried by local (bulk): the upstream is back"] * 12
    # Two ticked by hand, cancelled: the bar counts them, the dialog asks.
    browser.get(console.url + "/#/jobs?status=pending&label=batch%3Dnightly")
    until(browser, "#view[data-page=jobs] #job-filters select option[selected][value=pending]")
    until(browser, "#jobs tbody tr", "pending")
    for n in (1, 2):  # a refresh may land between finding a box and clicking it
        click(browser, "#jobs tbody tr:not(.picked) input.pick")
        until(browser, "#selection-count", f"{n} job{'s' if n > 1 else ''} selected")
    browser.save_screenshot(str(shots / "jobs-selected.png"))
    click(browser, "#bulk-cancel")
    until(browser, "#confirm h2", "Cancel 2 selected jobs")
    click(browser, "#confirm-ok")
    until(browser, "#flash", "cancelled 2 jobs")

    # A schedule, created and paused.
    browser.get(console.url + "/#/schedules")
    click(browser, "#new-schedule summary")
    until(browser, "#schedule-name").send_keys("nightly-report")
    until(browser, "#schedule-cron").send_keys("30 2 * * *")
    until(browser, "#schedule-timezone").send_keys("Europe/Riga")
    until(browser, "#schedule-add").click()
    until(browser, "#schedules tr[data-schedule=nightly-report] .state", "active")
    click(browser, "#schedules tr[data-schedule=nightly-report] button[data-action=pause]")
    until(browser, "#schedules tr[data-schedule=nightly-report] .state", "paused")
    browser.save_screenshot(str(shots / "schedules.png"))
    shown = json.loads(run_cli(dsn, "schedule", "show", "nightly-report", "-o", "json").stdout)
    assert (shown["paused"], shown["timezone"]) == (True, "Europe/Riga")

    # The queue page: counts by state, the last hour's chart, a queue no worker serves.
    enqueue(dsn, 'sleep:{"seconds": 0}', "--queue", "orphans")
    with connect(dsn) as conn:
        conn.execute("""
            INSERT INTO job_metric_history (minute, queue, name, label, le, value)
            SELECT date_trunc('minute', now()) - make_interval(mins => m), 'reports', x.name,
                   x.label, x.le, x.v * (1 + (m % 7))
            FROM generate_series(0, 59) AS m,
                 (VALUES ('finished', 'succeeded', 'Infinity'::float8, 3::float8),
                         ('finished', 'failed', 'Infinity', 0.34), ('wait', '', 1, 3),
                         ('run', '', 5, 2), ('run', '', 30, 1), ('run', '', 60, 0.2))
                 AS x (name, label, le, v)""")
    browser.get(console.url + "/#/queues")
    until(browser, "#queues tr[data-queue=orphans] .state", "no worker yet")
    until(browser, "#queue-warnings", "orphans")
    until(browser, ".chart[data-queue=reports] canvas")
    _refreshed(browser)  # the chart is given new data, not drawn anew
    assert len(browser.find_elements("css selector", ".chart[data-queue=reports] .uplot")) == 1
    browser.save_screenshot(str(shots / "queue-chart.png"))
    errors = _errors(browser)
    assert errors == [], errors


def _log_reads(browser: Any) -> int:
    """How many times the page asked for a job's output (the browser's own record)."""
    return int(browser.execute_script(
        "return performance.getEntriesByType('resource')"
        ".filter(e => e.name.includes('/logs')).length"))


def test_a_jobs_whole_output_on_its_page(browser: Any, dsn: str, tmp_path: Path,
                                        s3_env: dict[str, str], shots: Path) -> None:
    """3,000 lines: the tail kept in the database has lost the first ones; the page shows
    the stream whole, from S3 — with the command's argv and its env's names, values masked.
    The output is read when its block is opened, once, not at every refresh; a stream larger
    than an answer comes a page at a time ("Show more")."""
    secret = "s3cr3t-never-on-the-page"
    cmd = json.dumps({"argv": ["sh", "-c", "seq 1 3000; echo 'all done' >&2"],
                      "env": {"WAREHOUSE_TOKEN": secret}})
    ran = enqueue(dsn, f"command:{cmd}", **s3_env)
    big = enqueue(dsn, "command:" + json.dumps({"argv": ["seq", "1", "200000"]}), **s3_env)
    assert run_cli(dsn, "worker", "--max-jobs", "2", **{**FAST, **s3_env}).returncode == 0
    with serve(dsn, JOBFENCE_AUTH="none", TMPDIR=str(tmp_path), **s3_env) as console:
        browser.get(console.url + f"/#/jobs/{ran}")
        until(browser, "#actions code.argv", "sh -c 'seq 1 3000; echo '")
        _refreshed(browser)
        assert _log_reads(browser) == 0  # nothing read until asked
        click(browser, "#actions details.whole summary", "stdout (whole output, 13,893 bytes)")
        text = until(browser, "#actions pre.log-stdout").text
        assert text.splitlines() == [str(i) for i in range(1, 3001)]
        assert secret not in browser.page_source
        browser.execute_script("document.querySelector('#actions pre.log-stdout')"
                               ".scrollTop = 1e9")
        browser.save_screenshot(str(shots / "job-full-log.png"))
        _refreshed(browser)  # the open block stays open, and is not read again
        assert browser.execute_script("return document.querySelector("
                                      "'#actions details.whole').open") is True
        assert _log_reads(browser) == 1

        browser.get(console.url + f"/#/jobs/{big}")
        click(browser, "#actions details.whole summary", "stdout (whole output, 1,288,895 "
                                                         "bytes)")
        until(browser, "#actions .note", "are shown")
        first = until(browser, "#actions pre.log-stdout").text.splitlines()
        assert first[0] == "1" and len(first) < 200_000
        click(browser, "#actions button.log-more")
        wait_for(lambda: browser.execute_script(
            "return document.querySelector('#actions .log-more') === null"
            " && document.querySelector('#actions .reading') === null"), timeout=20)
        shown = until(browser, "#actions pre.log-stdout").text.splitlines()
        assert shown == [str(i) for i in range(1, 200_001)]
        assert not _errors(browser)


def test_a_workflow_in_the_console(browser: Any, console: Served, dsn: str,
                                   shots: Path) -> None:
    """A workflow's graph, each step coloured by its state as it runs and fails; a retry
    from its page runs the failed and the never-run steps again."""
    sleep = [{"name": "sleep", "params": {"seconds": 0}}]
    failing = [{"name": "command", "params": {"argv": ["false"]}}]
    wf = {"workflow": "nightly-etl", "steps": {
        "extract": {"actions": sleep},
        "load-eu": {"actions": failing, "after": ["extract"], "max_attempts": 1},
        "load-us": {"actions": sleep, "after": ["extract"]},
        "report": {"actions": sleep, "after": ["load-eu"], "inputs": {"steps": ["load-us"]}}}}
    r = run_cli(dsn, "enqueue", "--spec", "-", input=json.dumps(wf))
    assert r.returncode == 0, r.stderr
    wid = json.loads(r.stdout)["workflow_id"]
    browser.get(console.url + "/#/workflows")
    until(browser, f"#workflows tr[data-workflow='{wid}'] .state", "running")
    assert run_cli(dsn, "worker", "--max-jobs", "4", "--idle-seconds", "1",
                   **FAST).returncode == 1  # load-eu failed
    browser.get(console.url + f"/#/workflows/{wid}")
    until(browser, "#workflow-facts dd[data-fact=status]", "failed")
    until(browser, "#workflow-facts dd[data-fact=status]", "at step load-eu")
    until(browser, "#workflow-graph a.step[data-step=load-eu]", "failed")
    until(browser, "#workflow-graph a.step[data-step=load-us]", "succeeded")
    until(browser, "#steps tr[data-step=report]", "(step load-eu) failed")
    until(browser, "#steps td[data-inputs=report]", "load-us")  # the files it would take
    browser.save_screenshot(str(shots / "workflow-failed.png"))
    click(browser, "#retry-workflow")
    click(browser, "#confirm-ok")
    until(browser, "#workflow-graph a.step[data-step=load-eu]", "pending")
    until(browser, "#workflow-graph a.step[data-step=report]", "waiting")
    browser.save_screenshot(str(shots / "workflow-retried.png"))

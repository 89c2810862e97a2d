"""The console in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
driven by Selenium), against a real ``jobfence serve`` and real workers: see a queue's depth,
open a failed job and read its error and output tail, retry it and watch it succeed without
reloading, pause a queue, cancel a running job and see its worker's child gone.

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

from tests.acceptance.serving import Served, serve
from tests.conftest import role_dsn, run_cli
from tests.kube import ControlPlane
from tests.procs import FAST, alive, enqueue, job, kill_quietly, read_pid, spawn, wait_for

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
    assert "loading rows" in until(browser, "#actions pre.tail-stdout").text
    assert "bad row 17: not a date" in until(browser, "#actions pre.tail-stderr").text
    assert "exit 3" in until(browser, "#actions .exit").text
    until(browser, "#attempts td", "failed")
    browser.save_screenshot(str(shots / "job-failed.png"))

    # Retry it, and watch it succeed while the page refreshes by itself.
    mark.touch()
    click(browser, "#retry-job")
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
    limit = wait_for(lambda: _alert(browser), timeout=10)
    limit.send_keys("2")
    limit.accept()
    until(browser, "#queues tr[data-queue=reports] td.num", "2")
    assert json.loads(run_cli(dsn, "queue", "status", "reports", "-o", "json").stdout)[
        "limit"] == 2

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
        until(browser, "#job-facts dd[data-fact=status]", "cancelled")
        wait_for(lambda: not alive(child), timeout=15)
        assert worker.wait(timeout=30) == 1
    finally:
        kill_quietly(worker)

    # Functions: health and runs; a manual trigger asks why, and is recorded.
    browser.get(console.url + "/#/functions")
    until(browser, "#functions tr[data-function=sweeper]")
    click(browser, "#functions tr[data-function=sweeper] button[data-action=trigger]")
    alert = wait_for(lambda: _alert(browser), timeout=10)
    alert.send_keys("checking leases after the deploy")
    alert.accept()
    until(browser, "#triggers", "checking leases after the deploy")
    until(browser, "#runs", "sweeper", timeout=40)
    browser.save_screenshot(str(shots / "functions.png"))

    # The drain switch.
    click(browser, "#drain-toggle")
    wait_for(lambda: _alert(browser), timeout=10).accept()
    until(browser, "#drain", "draining")
    assert run_cli(dsn, "enqueue", 'sleep:{"seconds": 0}').returncode == 4


def _alert(browser: Any) -> Any:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        return browser.switch_to.alert
    except NoAlertPresentException:
        return None


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
    from tests.kube import kubeconfig_for, service_account, token

    enqueue(dsn, 'sleep:{"seconds": 0}', "--queue", "reports")
    service_account(kube, namespace, "console", cluster_role="system:auth-delegator")
    service_account(kube, namespace, "viewer")
    viewer = token(kube, namespace, "viewer")
    kubeconfig = kubeconfig_for(kube, namespace, "console", tmp_path / "kubeconfig")
    with serve(dsn, JOBFENCE_AUTH="tokenreview", JOBFENCE_CLUSTER="kubernetes",
               JOBFENCE_NAMESPACE=namespace, JOBFENCE_AUTH_OPERATORS="group:ops",
               KUBECONFIG=str(kubeconfig)) as s:
        browser.get(s.url + "/#/queues")
        box = until(browser, "#login-token")
        assert box.is_displayed()  # no token yet: the console asks for one
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

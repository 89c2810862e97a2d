"""A command's whole output, through the real worker against moto's S3 server: on S3
whole and in the worker's log line by line while the worker's memory stays flat; read back
by `jobfence logs` (whole, or followed as it comes); a small output stays in the database;
the worker's log lines are bounded per second. And what stops a command that has gone
quiet (the inactivity timeout), and what a command used (CPU time, peak memory)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from devtools.sqlconn import connect
from jobfence.adapters.s3 import S3ObjectStore
from jobfence.objectstore import log_prefix
from jobfence.store import Store
from tests.support import JOBFENCE, REPO, cli_env, run_cli
from tests.support.procs import action_results, enqueue, job, spawn, wait_for

LINES = 819_200  # 64 bytes each: 50 MiB
BIG = (f"import sys\nw = sys.stdout.write\nfor i in range({LINES}):\n    w(f'{{i:063d}}\\n')\n"
       "sys.stderr.write('done\\n')\n")


def _expected_stdout() -> str:
    digest = hashlib.sha256()
    for i in range(LINES):
        digest.update(f"{i:063d}\n".encode())
    return digest.hexdigest()


def _command(*argv: str, **spec: object) -> str:
    return "command:" + json.dumps({"argv": list(argv), **spec})


def _peak_rss_while_it_runs(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """The worker's own high-water mark of resident memory (VmHWM), read until it exits;
    and its stderr."""
    peak = 0
    err: list[str] = []
    assert proc.stdout is not None and proc.stderr is not None
    readers = [threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True),
               threading.Thread(target=proc.stdout.read, daemon=True)]
    for reader in readers:
        reader.start()
    while proc.poll() is None:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except OSError:
            break
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                peak = max(peak, int(line.split()[1]) * 1024)
        time.sleep(0.05)
    proc.wait(timeout=120)
    for reader in readers:
        reader.join(timeout=10)
    proc.stdout.close()
    proc.stderr.close()
    return peak, "".join(err)


def _log_lines(stderr: str, event: str) -> list[dict[str, object]]:
    out = []
    for line in stderr.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("event") == event:
                out.append(entry)
    return out


def test_a_50_mb_output_reaches_s3_whole_and_the_log_line_by_line_with_flat_memory(
        dsn: str, s3_env: dict[str, str]) -> None:
    lines = {"JOBFENCE_OUTPUT_LINES_PER_SECOND": "2000"}
    # The baseline writes 5 MiB: the worker then has its S3 client and writes objects too.
    small = enqueue(dsn, _command(sys.executable, "-c", BIG.replace(str(LINES), "81920")),
                    **s3_env)
    baseline, _ = _peak_rss_while_it_runs(
        spawn(dsn, "worker", "--max-jobs", "1", **s3_env, **lines))
    assert job(dsn, small)["status"] == "succeeded"
    big = enqueue(dsn, _command(sys.executable, "-c", BIG), **s3_env)
    peak, stderr = _peak_rss_while_it_runs(
        spawn(dsn, "worker", "--max-jobs", "1", **s3_env, **lines))
    row = job(dsn, big)
    assert row["status"] == "succeeded", stderr[-2000:]
    # Flat: the worker holds a chunk per stream at most, never what the command wrote.
    assert peak - baseline < 16 * 2**20, (peak, baseline)

    [result] = [r["result"] for r in action_results(dsn, big)]
    assert result["stdout_bytes"] == LINES * 64 and result["output_on_s3"] is True
    assert result["stderr_bytes"] == 5 and result["stdout_tail"].endswith(f"{LINES - 1:063d}\n")
    with connect(dsn) as conn:
        installation = str(Store(conn).control.identity().installation)
        logged = conn.execute("SELECT attempt_id, action_index FROM job_logs "
                              "WHERE job_id = %s", (big,)).fetchall()
    assert [(r["attempt_id"], r["action_index"]) for r in logged] == [(row["attempt_id"], 0)]
    s3 = S3ObjectStore(endpoint_url=s3_env["JOBFENCE_S3_ENDPOINT_URL"])
    prefix = log_prefix(installation, row["job_id"], row["attempt_id"], 0, "stdout")
    keys = [o.key for o in s3.iter_objects(s3_env["JOBFENCE_S3_BUCKET"], prefix)]
    assert keys == [f"{prefix}{n:08d}" for n in range(1, 14)]  # 4 MiB objects, in order

    # The worker's log: whole lines, each saying whose; what the budget dropped is counted.
    said = _log_lines(stderr, "output")
    assert said and all(e["job_id"] == big and e["attempt"] == 1 and e["action"] == 0
                        for e in said)
    out_lines = [e for e in said if e["stream"] == "stdout"]
    assert all(len(str(e["line"])) == 63 for e in out_lines)
    numbers = [int(str(e["line"])) for e in out_lines]
    assert numbers == sorted(numbers) and numbers[0] == 0
    dropped = sum(int(str(e["lines"])) for e in _log_lines(stderr, "output_lines_dropped"))
    assert len(said) + dropped == LINES + 1  # every line said or counted, the stderr one too

    # `jobfence logs` reads it back whole, byte for byte.
    got = subprocess.run([*JOBFENCE, "logs", big, "--stream", "stdout"], cwd=REPO,
                         env=cli_env(dsn, "logs", **s3_env), capture_output=True, timeout=120,
                         check=True)
    assert hashlib.sha256(got.stdout).hexdigest() == _expected_stdout()
    both = run_cli(dsn, "logs", big, "--stream", "stderr", **s3_env)
    assert both.stdout == "done\n"


def test_a_small_output_stays_in_the_database_and_logs_shows_it(
        dsn: str, s3_env: dict[str, str]) -> None:
    job_id = enqueue(dsn, _command("sh", "-c", "echo one; echo two >&2"),
                     _command("sh", "-c", "echo three"), **s3_env)
    assert run_cli(dsn, "worker", "--max-jobs", "1", **s3_env).returncode == 0
    with connect(dsn) as conn:
        assert conn.execute("SELECT count(*) AS n FROM job_logs").fetchone()["n"] == 0
    s3 = S3ObjectStore(endpoint_url=s3_env["JOBFENCE_S3_ENDPOINT_URL"])
    assert not list(s3.iter_objects(s3_env["JOBFENCE_S3_BUCKET"], ""))
    shown = run_cli(dsn, "logs", job_id, **s3_env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == (
        "==> attempt 1, action 1 (command): stdout, 4 bytes <==\none\n"
        "==> attempt 1, action 1 (command): stderr, 4 bytes <==\ntwo\n"
        "==> attempt 1, action 2 (command): stdout, 6 bytes <==\nthree\n"
        "==> attempt 1, action 2 (command): stderr, 0 bytes <==\n")
    assert run_cli(dsn, "logs", job_id, "--action", "2", "--stream", "stdout",
                   **s3_env).stdout == "three\n"
    assert run_cli(dsn, "logs", job_id, "--attempt", "2").returncode == 2
    assert run_cli(dsn, "logs", "0190f3a0-0000-7000-8000-000000000000").returncode == 5


def test_logs_follow_prints_a_running_commands_output_as_it_comes(
        dsn: str, s3_env: dict[str, str]) -> None:
    script = "for i in $(seq 1 36); do echo line $i; sleep 0.25; done"
    job_id = enqueue(dsn, _command("sh", "-c", script), **s3_env)
    worker = spawn(dsn, "worker", "--max-jobs", "1", **s3_env)
    wait_for(lambda: job(dsn, job_id)["status"] == "running")
    follow = subprocess.Popen([*JOBFENCE, "logs", job_id, "--follow", "--stream", "stdout",
                               "--interval", "0.2"], cwd=REPO, text=True,
                              env=cli_env(dsn, "logs", **s3_env), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    assert follow.stdout is not None
    first = follow.stdout.readline()
    seen_at = time.monotonic()
    assert first == "line 1\n"
    assert job(dsn, job_id)["status"] == "running"  # it came while the command ran
    rest = follow.stdout.read()  # what readline buffered too: not communicate()
    _, err = follow.communicate(timeout=30)
    assert follow.returncode == 0, err
    assert (first + rest).splitlines() == [f"line {i}" for i in range(1, 37)]
    worker.communicate(timeout=30)
    assert worker.returncode == 0
    assert time.monotonic() - seen_at > 0.5


def test_the_workers_log_is_bounded_per_second_whatever_a_job_writes(dsn: str) -> None:
    enqueue(dsn, _command(sys.executable, "-c", "for i in range(20000): print(i)"))
    started = time.monotonic()
    r = run_cli(dsn, "worker", "--max-jobs", "1", JOBFENCE_OUTPUT_LINES_PER_SECOND="50",
                JOBFENCE_LOG_FORMAT="json")
    took = time.monotonic() - started
    assert r.returncode == 0, r.stderr
    said = _log_lines(r.stderr, "output")
    assert 0 < len(said) <= 50 * (int(took) + 2)
    dropped = sum(int(str(e["lines"])) for e in _log_lines(r.stderr, "output_lines_dropped"))
    assert len(said) + dropped == 20000
    assert [e["event"] for e in map(json.loads, filter(None, r.stderr.splitlines()))
            if e.get("event") == "job_succeeded"]  # the worker's own lines are still there


def test_the_inactivity_timeout_stops_a_silent_command_and_leaves_a_chatty_one(
        dsn: str) -> None:
    silent = enqueue(dsn, _command("sleep", "60"), "--inactivity-timeout", "PT2S",
                     "--max-attempts", "1")
    chatty = enqueue(dsn, _command("sh", "-c", "for i in 1 2 3 4 5 6 7 8; do echo $i; "
                                   "sleep 0.5; done"), "--inactivity-timeout", "PT2S")
    shown = json.loads(run_cli(dsn, "status", silent, "-o", "json").stdout)
    assert shown["inactivity_timeout"] == "PT2S"
    assert shown["actions"][0]["inactivity_timeout"] == "PT2S"
    started = time.monotonic()
    r = run_cli(dsn, "worker", "--max-jobs", "2", "--concurrency", "2", timeout=90)
    took = time.monotonic() - started
    assert job(dsn, chatty)["status"] == "succeeded", r.stderr
    row = job(dsn, silent)
    assert row["status"] == "failed" and took < 30
    assert row["error"] == "inactive: no output or progress for PT2S"
    [result] = action_results(dsn, silent)
    assert result["error"] == "inactive: no output or progress for PT2S"
    with connect(dsn) as conn:
        reasons = [e["reason"] for e in conn.execute(
            "SELECT reason FROM job_events WHERE job_id = %s ORDER BY event_id", (silent,))]
    assert any("inactive" in (why or "") for why in reasons), reasons
    # The worker's setting applies where the spec says nothing: a retry with attempts left.
    again = enqueue(dsn, _command("sleep", "60"), "--max-attempts", "2")
    run_cli(dsn, "worker", "--max-jobs", "1", JOBFENCE_INACTIVITY_TIMEOUT="PT1S",
            JOBFENCE_RETRY_BASE_SECONDS="60")
    row = job(dsn, again)
    assert (row["status"], row["attempt_count"]) == ("pending", 1)
    # Each stop counted, by queue and why, once a pass has folded the metrics.
    assert run_cli(dsn, "sweeper").returncode == 0
    exported = run_cli(dsn, "metrics").stdout
    assert 'jobfence_job_stops_total{queue="default",why="inactive"} 2.0' in exported
    assert row["error"] == "inactive: no output or progress for PT1S"


USAGE = """
import time
block = bytearray(200 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1  # resident, not only reserved
while time.process_time() < 1.0:
    pass
"""


def test_a_commands_cpu_time_and_peak_memory_are_reported(dsn: str) -> None:
    job_id = enqueue(dsn, _command(sys.executable, "-c", USAGE))
    assert run_cli(dsn, "worker", "--max-jobs", "1").returncode == 0
    [result] = [r["result"] for r in action_results(dsn, job_id)]
    used = result["usage"]
    assert 0.8 <= used["cpu_seconds"] <= 1.2, used
    assert 200 * 2**20 * 0.8 <= used["peak_memory_bytes"] <= 200 * 2**20 * 1.2, used
    shown = run_cli(dsn, "status", job_id).stdout
    assert f"used: {used['cpu_seconds']} s CPU" in shown and "MiB peak memory" in shown
    # A small command is small: not the worker's image it was forked from.
    small = enqueue(dsn, _command("sh", "-c", "sleep 0.3"))
    assert run_cli(dsn, "worker", "--max-jobs", "1").returncode == 0
    [result] = [r["result"] for r in action_results(dsn, small)]
    assert 0 < result["usage"]["peak_memory_bytes"] < 16 * 2**20, result["usage"]
    # A tree: two processes holding 100 MiB each at once are 200 MiB together.
    tree = ("import subprocess, sys\n"
            "code = 'b = bytearray(100 * 2**20)\\nfor i in range(0, len(b), 4096): b[i] = 1\\n"
            "import time; time.sleep(2)'\n"
            "procs = [subprocess.Popen([sys.executable, '-c', code]) for _ in range(2)]\n"
            "[p.wait() for p in procs]\n")
    tree_job = enqueue(dsn, _command(sys.executable, "-c", tree))
    assert run_cli(dsn, "worker", "--max-jobs", "1").returncode == 0
    [result] = [r["result"] for r in action_results(dsn, tree_job)]
    assert result["usage"]["peak_memory_bytes"] >= 200 * 2**20 * 0.9, result["usage"]


def test_logs_shows_a_jobs_control_characters_to_a_person_and_pipes_them_as_written(
        dsn: str) -> None:
    """A job's output may hold escape sequences (write the clipboard, retitle the window,
    clear the screen): `jobfence logs` on a terminal shows them, piped it keeps them."""
    import os
    import pty

    hostile = "printf 'before\\033]52;c;cm0gLXJmIC8K\\007\\033[2Jafter\\n'"
    job_id = enqueue(dsn, _command("sh", "-c", hostile))
    assert run_cli(dsn, "worker", "--max-jobs", "1").returncode == 0
    piped = subprocess.run([*JOBFENCE, "logs", job_id, "--stream", "stdout"], cwd=REPO,
                           env=cli_env(dsn, "logs"), capture_output=True, check=True)
    assert piped.stdout == b"before\x1b]52;c;cm0gLXJmIC8K\x07\x1b[2Jafter\n"
    leader, follower = pty.openpty()
    shown = subprocess.run([*JOBFENCE, "logs", job_id, "--stream", "stdout"], cwd=REPO,
                           env=cli_env(dsn, "logs"), stdout=follower,
                           stderr=subprocess.PIPE, check=True, timeout=60)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal's other end is closed: all read
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert shown.returncode == 0
    assert b"\x1b" not in seen and b"\x07" not in seen
    assert seen.replace(b"\r\n", b"\n") == b"before\\x1b]52;c;cm0gLXJmIC8K\\x07\\x1b[2Jafter\n"
    status = run_cli(dsn, "status", job_id)  # its tail, for a person: shown, not obeyed
    assert "\x1b" not in status.stdout and "before\\x1b]52;c;" in status.stdout


def test_status_events_show_a_failed_commands_stderr_escaped(dsn: str) -> None:
    """A failed command's stderr reaches the audit trail's reasons: `status --events` shows
    it as the rest of `status` does, escaped, never obeyed by the terminal."""
    hostile = "printf 'boom\\033]52;c;cm0gLXJmIC8K\\007\\033[2J\\n' >&2; exit 3"
    job_id = enqueue(dsn, _command("sh", "-c", hostile), "--max-attempts", "1")
    assert run_cli(dsn, "worker", "--max-jobs", "1").returncode == 1
    shown = run_cli(dsn, "status", job_id, "--events")
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout, shown.stdout
    events = [line for line in shown.stdout.splitlines() if " -> " in line]
    assert any("boom\\x1b]52;c;" in line for line in events), shown.stdout


def test_the_api_answers_an_attempts_output(dsn: str, s3_env: dict[str, str],
                                           tmp_path: Path) -> None:
    from tests.support.serving import serve

    job_id = enqueue(dsn, _command("sh", "-c", "seq 1 3000; echo oops >&2; exit 3"),
                     "--max-attempts", "1", **s3_env)
    assert run_cli(dsn, "worker", "--max-jobs", "1", **s3_env).returncode == 1
    with serve(dsn, JOBFENCE_AUTH="none", TMPDIR=str(tmp_path), **s3_env) as server:
        r = server.get(f"/api/v1/jobs/{job_id}/logs")
        assert r.status == 200, r.body
        out, err = r.body["pieces"]
        assert (r.body["attempt"], r.body["running"]) == (1, False)
        assert (out["stream"], out["on_s3"], out["whole"], out["size"]) == ("stdout", True,
                                                                            True, 13893)
        assert out["text"].splitlines() == [str(i) for i in range(1, 3001)]
        assert (err["text"], err["unavailable"]) == ("oops\n", None)
        assert server.get(f"/api/v1/jobs/{job_id}/logs?attempt=2").status == 400
    # A server without the S3 settings still answers: the tails, and why not the rest.
    with serve(dsn, JOBFENCE_AUTH="none", TMPDIR=str(tmp_path)) as server:
        r = server.get(f"/api/v1/jobs/{job_id}/logs")
        assert r.status == 200, r.body
        out = r.body["pieces"][0]
        assert out["whole"] is False and "JOBFENCE_S3_BUCKET" in out["unavailable"]

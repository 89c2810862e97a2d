"""jobfence against a real Patroni cluster in the supported setup (a synchronous standby that
must acknowledge each commit): a cancelled wait for the standby is not taken for a success;
a heartbeat's deadline hangs up instead of cancelling; a terminal write whose connection
dies while its COMMIT waits for the standby is read back on the writer and counted only
once durable; a switchover and a node loss are ridden out without losing an acknowledged
write; a URL whose hosts are all replicas is refused at once (exit 4), and a worker sent to
a replica never claims; an enqueue whose answer was lost in a failover is made exactly once
when it is sent again with its idempotency key; a statement to a frozen primary is hung up
on at its deadline."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

from devtools.patroni import Member, PatroniCluster
from jobfence import db
from jobfence.db import Connection
from jobfence.errors import ExitCode, StoreUnavailable, Unreplicated
from jobfence.settings import Settings
from jobfence.store import Store, TerminalWrite
from jobfence.store.migrations import migrate
from jobfence.worker.guard import Guard
from jobfence.worker.store_link import StoreLink
from tests.support import JOBFENCE, REPO, cli_env
from tests.support.factories import enqueue_one

pytestmark = pytest.mark.slow
DBNAME = "jf_failover"


@pytest.fixture(scope="module")
def cluster(patroni_sync: PatroniCluster) -> PatroniCluster:
    with db.connect(patroni_sync.dsn) as admin:
        admin.execute(f"CREATE DATABASE {DBNAME}")
    with db.connect(patroni_sync.url(DBNAME)) as conn:
        migrate(conn)
    return patroni_sync


@pytest.fixture
def url(cluster: PatroniCluster) -> Iterator[str]:
    cluster.wait_healthy(180)  # a test that failed over leaves the next one a whole cluster
    yield cluster.url(DBNAME)


@pytest.fixture
def conn(url: str) -> Iterator[Connection]:
    with db.connect(url) as c:
        yield c


@pytest.fixture
def store(conn: Connection) -> Store:
    return Store(conn)


def standbys(cluster: PatroniCluster) -> list[Member]:
    leader = cluster.leader()
    return [m for m in cluster.members if m is not leader]


@contextlib.contextmanager
def standbys_frozen(cluster: PatroniCluster) -> Iterator[None]:
    """No standby can acknowledge a commit (their servers stopped where they are, their
    Patroni left running): a commit on the primary waits."""
    pids = [p for m in standbys(cluster) for p in m.server_pids()]
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    try:
        yield
    finally:
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)


def settings(url: str, **kw: Any) -> Settings:
    kw.setdefault("lease_seconds", 60)
    kw.setdefault("heartbeat_seconds", 2)
    return Settings(database_url=url, **kw)


def row_of(url: str, job_id: UUID) -> dict[str, Any]:
    with db.connect(url) as c:
        found = c.execute("SELECT status, attempt_id FROM jobfence.jobs WHERE job_id = %s",
                          (job_id,)).fetchone()
    assert found is not None
    return found


def test_a_cancelled_wait_for_the_standby_is_unreplicated_not_a_success(
        cluster: PatroniCluster, conn: Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS public.marks (n int)")
    with standbys_frozen(cluster):
        threading.Timer(1.0, db.cancel_quietly, args=(conn,)).start()
        with pytest.raises(Unreplicated):
            db.execute(conn, "INSERT INTO public.marks VALUES (1)")
        assert db.stale(conn)
    # PostgreSQL did report success, and the row is there on the primary: without the
    # WARNING being read, the client would have counted a commit no standby had.


def test_a_deadline_hangs_up_instead_of_cancelling_a_commit(
        cluster: PatroniCluster, url: str) -> None:
    c = db.connect(url)
    c.execute("CREATE TABLE IF NOT EXISTS public.marks (n int)")
    try:
        with standbys_frozen(cluster):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable), db.deadline(c, 1.0):
                db.execute(c, "INSERT INTO public.marks VALUES (2)")
            assert time.monotonic() - started < 5
            assert db.stale(c)
            assert not isinstance(_raised(c), Unreplicated)
    finally:
        c.close()


def _raised(c: Connection) -> BaseException | None:
    try:
        db.execute(c, "SELECT 1")
    except BaseException as exc:
        return exc
    return None


def test_a_terminal_write_cut_off_in_its_commit_is_counted_once_durable(
        cluster: PatroniCluster, url: str, store: Store) -> None:
    """The COMMIT waits for a standby that cannot answer; its backend is terminated there
    (committed on the primary, not on a standby). The store_link reads the job back on a
    fresh connection and confirms the write durable only once a standby has it."""
    store_link = StoreLink(settings(url), "default")
    try:
        enqueue_one(store)
        [claim] = store_link.claim(1)
        guard = Guard(claim, store_link.settings)
        pid = store_link.store.conn.info.backend_pid
        result: list[Any] = []
        with standbys_frozen(cluster):
            t = threading.Thread(target=lambda: result.append(store_link.finish(
                guard, TerminalWrite(claim.job_id, claim.attempt_id, True), False)))
            t.start()
            time.sleep(1.5)
            with db.connect(url) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            time.sleep(3.0)  # read back, not yet confirmed: still waiting
            assert not result
        t.join(timeout=60)
        assert result and result[0].written
        assert row_of(url, claim.job_id)["status"] == "succeeded"
    finally:
        store_link.close()


@pytest.mark.parametrize("change", ["switchover", "failover"])
def test_a_change_of_leader_is_ridden_out_by_the_writes_in_flight(
        cluster: PatroniCluster, url: str, store: Store, change: str) -> None:
    """A planned switchover (``patronictl switchover``) and an operator's failover to a
    named standby (``patronictl failover``)."""
    store_link = StoreLink(settings(url), "default")
    try:
        enqueue_one(store)
        [claim] = store_link.claim(1)
        guard = Guard(claim, store_link.settings)
        before = cluster.leader()
        getattr(cluster, change)()
        cluster.wait_until(lambda: cluster.leader() not in (None, before), 60,
                           f"no new leader after the {change}")
        renewed = store_link.write(guard, lambda s: s.attempts.heartbeat(
            job_id=claim.job_id, attempt_id=claim.attempt_id, lease_seconds=60))
        assert renewed is not None
        done = store_link.finish(guard, TerminalWrite(claim.job_id, claim.attempt_id, True),
                                False)
        assert done.written
        assert row_of(url, claim.job_id)["status"] == "succeeded"
    finally:
        store_link.close()


def test_a_node_loss_keeps_every_acknowledged_write(
        cluster: PatroniCluster, url: str, store: Store) -> None:
    store_link = StoreLink(settings(url), "default")
    try:
        finished = [enqueue_one(store) for _ in range(5)]
        running = enqueue_one(store)
        claims = store_link.claim(6)
        by_id = {c.job_id: c for c in claims}
        for job_id in finished:
            c = by_id[job_id]
            assert store_link.finish(Guard(c, store_link.settings),
                                    TerminalWrite(c.job_id, c.attempt_id, True), False).written
        old = cluster.leader()
        assert old is not None
        cluster.kill(old)
        cluster.wait_until(lambda: cluster.leader() not in (None, old), 90,
                           "no new leader after the node loss")
        c = by_id[running]
        assert store_link.finish(Guard(c, store_link.settings),
                                TerminalWrite(c.job_id, c.attempt_id, True), False).written
        for job_id in [*finished, running]:
            assert row_of(url, job_id)["status"] == "succeeded"
        cluster.start_member(old)
    finally:
        store_link.close()


def test_a_url_of_replicas_only_is_refused_within_the_connect_timeout(
        cluster: PatroniCluster) -> None:
    replicas = standbys(cluster)
    hosts = ",".join(f"127.0.0.1:{m.pg_port}" for m in replicas)
    url = f"postgresql://postgres@{hosts}/{DBNAME}?connect_timeout=2"
    started = time.monotonic()
    done = subprocess.run([*JOBFENCE, "worker", "--max-jobs", "1"], env=cli_env(url),
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    took = time.monotonic() - started
    assert done.returncode == ExitCode.UNAVAILABLE, done.stderr
    assert "no host of JOBFENCE_DATABASE_URL takes writes" in done.stderr
    assert took < 2 * 2 + 10  # each host's timeout, and the interpreter's start


def test_a_worker_sent_to_a_replica_never_claims(
        cluster: PatroniCluster, url: str, store: Store) -> None:
    job_id = enqueue_one(store)
    replica = standbys(cluster)[0]
    done = subprocess.run([*JOBFENCE, "worker", "--max-jobs", "1"],
                          env=cli_env(replica.url(DBNAME)), cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == ExitCode.UNAVAILABLE, done.stderr
    assert "takes no writes" in done.stderr
    assert row_of(url, job_id)["status"] == "pending"


def test_migrate_on_the_synchronous_cluster_warns_of_nothing(cluster: PatroniCluster) -> None:
    done = subprocess.run([*JOBFENCE, "migrate"], env=cli_env(cluster.url(DBNAME)), cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr


def test_an_enqueue_whose_answer_was_lost_in_a_failover_is_made_once_by_its_key(
        cluster: PatroniCluster, url: str) -> None:
    """An enqueue's COMMIT waits for a standby that cannot answer; the client is killed
    there (it never learns the outcome) and the primary is lost. Run again with the same
    idempotency key on the new primary, it answers one job — the first one, if its commit
    reached a standby after all, else a new one — and there is exactly one."""
    key = f"lost-answer-{time.monotonic_ns()}"
    spec = json.dumps({"actions": [{"name": "sleep", "params": {"seconds": 0}}],
                       "idempotency_key": key})
    env = cli_env(url)
    old = cluster.leader()
    assert old is not None
    with standbys_frozen(cluster):
        first = subprocess.Popen([*JOBFENCE, "enqueue", "--spec", "-"], env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            first.communicate(spec, timeout=3.0)
        except subprocess.TimeoutExpired:  # its commit waits for a standby: as it should
            pass
        assert first.returncode is None, first.returncode
        first.kill()
        first.communicate()
        cluster.kill(old)
    cluster.wait_until(lambda: cluster.leader() not in (None, old), 120,
                       "no new leader after the node loss")
    again = subprocess.run([*JOBFENCE, "enqueue", "--spec", "-"], env=env, input=spec,
                           capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 0, again.stderr
    answered = json.loads(again.stdout)
    with db.connect(url) as c:
        rows = c.execute("SELECT job_id FROM jobfence.jobs WHERE idempotency_key = %s",
                         (key,)).fetchall()
    assert [str(r["job_id"]) for r in rows] == [answered["job_id"]]
    cluster.start_member(old)


def test_a_statement_to_a_frozen_primary_is_hung_up_on_at_its_deadline(
        cluster: PatroniCluster, url: str, store: Store) -> None:
    """A zombie primary (every process stopped, its sockets open) answers nothing: a
    heartbeat's deadline hangs up (StoreUnavailable) instead of waiting on the socket, and
    the connection is known stale — the worker's guard then stops its command in time."""
    enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="frozen", lease_seconds=60)
    c = db.connect(url)
    leader = cluster.leader()
    assert leader is not None
    try:
        cluster.freeze(leader)
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable), db.deadline(c, 1.0):
                Store(c).attempts.heartbeat_many([(claim.job_id, claim.attempt_id)], 60)
            assert time.monotonic() - started < 10
            assert db.stale(c)
        finally:
            cluster.thaw(leader)
    finally:
        c.close()

"""The command sidecar's protocol and the worker's link, in process (no PID namespace, no
database): one runner in a worker's life, from the expected uid; a socket directory of the
worker's alone; what is not the protocol refused; inputs and outputs crossing as
descriptors; a child's output tail; many jobs' children served at once, each ending
alone."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobfence.actions.child import ChildNotStarted, ChildOutput, Tail
from jobfence.errors import ConfigError
from jobfence.fsboundary import BoundaryError
from jobfence.jobuids import SameUser
from jobfence.worker.faults import GUARDS, MAX_ADOPTED, Faults
from jobfence.worker.sidecar import link as sidecar_link
from jobfence.worker.sidecar import serve
from jobfence.worker.sidecar.link import SidecarLink, SidecarSpace
from jobfence.worker.sidecar.protocol import Channel, ProtocolError, parse_request
from jobfence.worker.sidecar.serve import SidecarServer
from tests.support.procs import wait_for

RUNNER_UID = 10002
"""A runner's uid that is not the worker's."""

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")


# -- the link's own rules, in process --------------------------------------------------------


def dial(path: Path, hello: bool = True) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        raise
    if hello:
        sock.sendall(b'{"runner":{"version":1}}\n')
    return sock


def test_the_worker_takes_one_runner_and_then_leaves_nothing_to_connect_to(
        tmp_path: Path) -> None:
    link = SidecarLink(tmp_path / "worker" / "command.sock", connect_seconds=5)
    first = dial(link.path)
    try:
        control = link.request(open={"attempt": str(uuid.uuid4())})
        control.close()
        assert not link.path.exists()
        with pytest.raises(FileNotFoundError):
            dial(link.path)
        assert link.usable()
    finally:
        first.close()
    wait_for(lambda: not link.usable())  # the runner went: never another
    with pytest.raises(ChildNotStarted, match="starts no more commands"):
        link.request(open={"attempt": str(uuid.uuid4())})
    link.close()


@as_root
def test_a_runner_of_another_uid_is_refused(tmp_path: Path) -> None:
    link = SidecarLink(tmp_path / "worker" / "command.sock", runner_uid=RUNNER_UID,
                      connect_seconds=5)
    impostor = dial(link.path)  # root here, not the runner's uid
    try:
        with pytest.raises(ChildNotStarted, match=f"refused a command runner of uid 0 .*"
                                                  f"expected {RUNNER_UID}"):
            link.request(open={"attempt": str(uuid.uuid4())})
        assert not link.usable() and not link.path.exists()
    finally:
        impostor.close()
        link.close()


@as_root
def test_the_socket_directory_must_be_the_workers_alone(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(ConfigError, match="only the worker's user may write"):
        SidecarLink(open_dir / "command.sock")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, RUNNER_UID, RUNNER_UID)
    with pytest.raises(ConfigError, match="only the worker's user may write"):
        SidecarLink(theirs / "command.sock")
    (tmp_path / "mine").mkdir(mode=0o755)
    (tmp_path / "mine" / "command.sock").write_text("not a socket")
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        SidecarLink(tmp_path / "mine" / "command.sock")
    with pytest.raises(ConfigError, match="cannot make"):
        SidecarLink(tmp_path / "no" / "such" / "command.sock")


def test_no_runner_is_a_clear_refusal(tmp_path: Path) -> None:
    link = SidecarLink(tmp_path / "worker" / "command.sock", connect_seconds=0.2)
    with pytest.raises(ChildNotStarted, match=r"did not connect .* within 0\.2 s"):
        link.request(open={"attempt": str(uuid.uuid4())})
    assert not link.usable()
    link.close()


# -- the protocol, in process ----------------------------------------------------------------


@pytest.fixture
def link(tmp_path: Path) -> Iterator[SidecarLink]:
    """A worker's link to a runner serving in a thread of this process."""
    tmp_path.chmod(0o755)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    served = SidecarLink(tmp_path / "worker" / "command.sock", connect_seconds=5)
    runner = SidecarServer(served.path, SameUser(), scratch)
    thread = threading.Thread(target=runner.serve, daemon=True)
    thread.start()
    yield served
    served.close()
    runner.stop()
    thread.join(timeout=5)


def _raw(link: SidecarLink, data: bytes) -> dict[str, object] | None:
    channel = link.channel()
    channel.sock.sendall(data)
    channel.sock.shutdown(socket.SHUT_WR)
    try:
        return channel.receive()
    finally:
        channel.close()


def test_the_runner_refuses_what_is_not_the_protocol_and_goes_on(link: SidecarLink) -> None:
    for data in (b"not json\n", b"[1]\n", b'{"start": {"argv": []}}\n',
                 b'{"start": {"attempt": "x", "argv": ["x"], "env": {}}}\n',
                 b'{"open": {"attempt": "../../etc"}}\n', b'{"kill": true}\n',
                 b'{"inputs": {"attempt": "' + str(uuid.uuid4()).encode()
                 + b'", "paths": ["a"]}}\n'):
        reply = _raw(link, data)
        assert reply is not None and str(reply["error"]), data
    assert _raw(link, b"") is None  # a channel closed at once: nothing to say
    space = SidecarSpace(link, uuid.uuid4())
    paths = space.open()
    output = ChildOutput()
    child = space.start(["sh", "-c", "printf '%s' \"$X\"; pwd; exit 4"],
                        {"X": "from the env", "PATH": os.defpath}, output.add)
    assert wait_for(lambda: child.wait(0.1) is not None) and child.wait(0) == 4
    child.close()
    assert output.result()["stdout_tail"] == f"from the env{paths.workdir}\n"
    assert output.result()["stderr_tail"] == ""
    used = child.usage()  # the runner says what the child used
    assert used is not None and used.cpu_seconds >= 0  # too short for its memory to be seen
    space.close()


def test_inputs_and_outputs_cross_as_descriptors(link: SidecarLink) -> None:
    space = SidecarSpace(link, uuid.uuid4())
    paths = space.open()
    [a, b] = space.create_inputs(["a.txt", "deep/b.txt"])
    with a, b:
        a.write(b"alpha")
        b.write(b"beta")
    child = space.start(["sh", "-c", 'cat "$0"/a.txt "$0"/deep/b.txt > "$1"/out.txt; '
                                     'ln -s /etc/passwd "$1"/link; mkfifo "$1"/fifo; '
                                     'mkdir "$1"/sub && echo x > "$1"/sub/y',
                         paths.inputs, paths.outputs], {"PATH": os.defpath},
                        ChildOutput().add)
    assert wait_for(lambda: child.wait(0.1) is not None)
    assert child.wait(0) == 0
    child.close()
    listed, refused = space.list_outputs()
    assert [i.path for i in listed] == ["out.txt", "sub/y"]
    assert {r.path: r.why for r in refused} == {"fifo": "a FIFO", "link": "a symbolic link"}
    opened = space.open_outputs(listed)
    contents = []
    for f in opened:
        assert not isinstance(f, str)
        with f:
            contents.append(f.read())
    assert contents == [b"alphabeta", b"x\n"]
    space.close()
    assert not any(Path(paths.workdir).parent.iterdir())


def test_a_remote_childs_output_keeps_its_tail(link: SidecarLink) -> None:
    space = SidecarSpace(link, uuid.uuid4())
    space.open()
    output = ChildOutput()
    child = space.start([sys.executable, "-c",
                         "import sys; sys.stdout.write('x' * 300000 + 'END')"], {}, output.add)
    assert wait_for(lambda: child.wait(0.1) == 0)
    child.close()
    tail = Tail()
    tail.add(b"x" * 300000 + b"END")
    stdout = output.result()["stdout_tail"]
    assert stdout == tail.text() and stdout.endswith("END")
    assert output.result()["stdout_bytes"] == 300003
    space.close()


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
       | st.fixed_dictionaries({"start": st.fixed_dictionaries({
           "attempt": st.uuids().map(str) | st.text(), "argv": st.lists(st.text(), max_size=3),
           "env": st.dictionaries(st.text(), st.text(), max_size=3)})})
       | st.fixed_dictionaries({"inputs": st.fixed_dictionaries({
           "attempt": st.uuids().map(str), "paths": st.lists(st.text(), max_size=3)})}))
def test_a_first_message_is_a_request_or_a_protocol_error(message: object) -> None:
    if not isinstance(message, dict):
        return  # Channel.receive refuses anything but an object before parse_request
    try:
        kind, args = parse_request(message)
    except ProtocolError:
        return
    assert uuid.UUID(args["attempt"])
    if kind == "start":
        assert args["argv"] and args["argv"][0]
        assert all("=" not in k and k for k in args["env"])


def test_a_channel_carries_descriptors_with_their_message() -> None:
    a, b = socket.socketpair()
    left, right = Channel(a), Channel(b)
    with tempfile.TemporaryFile() as f1, tempfile.TemporaryFile() as f2:
        left.send(fds=[f1.fileno(), f2.fileno()], files=2)
        left.send(plain=True)
        got = right.receive_with_fds()
        assert got is not None and got[0] == {"files": 2} and len(got[1]) == 2
        for fd, f in zip(got[1], (f1, f2), strict=True):
            assert os.fstat(fd).st_ino == os.fstat(f.fileno()).st_ino
            os.close(fd)
        assert right.receive() == {"plain": True}
        left.send(fds=[f1.fileno()], sneaky=True)
        with pytest.raises(ProtocolError, match="descriptors where none belong"):
            right.receive()
    left.close()
    right.close()


def test_many_jobs_children_run_at_once_and_each_ends_alone(link: SidecarLink) -> None:
    """A worker running many jobs has as many children in the sidecar at once; killing one
    job's child leaves the others running."""
    spaces = [SidecarSpace(link, uuid.uuid4()) for _ in range(3)]
    children = []
    for space in spaces:
        space.open()
        children.append(space.start(["sleep", "30"], {"PATH": os.defpath}, ChildOutput().add))
    started = time.monotonic()
    children[1].kill()
    assert wait_for(lambda: children[1].wait(0.05) is not None)
    children[1].close()
    assert children[1].ended() and time.monotonic() - started < 5
    assert children[0].wait(0.2) is None and children[2].wait(0.2) is None  # still running
    for c in (children[0], children[2]):
        c.close()
        assert c.ended()
    for space in spaces:
        space.close()


def test_the_runners_guard_faults_are_counted_by_the_worker(
        link: SidecarLink, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner has no database: what its guards noted comes back with the answer that
    ends a request — a child's exit, a refusal — and the worker counts it as its own
    (invariant 15). In process the two share a module: each gets a counter of its own."""
    runner, worker = Faults(), Faults()
    monkeypatch.setattr(serve, "FAULTS", runner)
    monkeypatch.setattr(sidecar_link, "FAULTS", worker)
    runner.note("tree_kill", ProcessLookupError("a tick of the runner's tree kill raised"))
    space = SidecarSpace(link, uuid.uuid4())
    space.open()
    child = space.start(["true"], {"PATH": os.defpath}, ChildOutput().add)
    assert wait_for(lambda: child.wait(0.1) is not None)
    child.close()
    assert worker.take() == {"tree_kill": 1} and not runner.pending()

    def broken(*_: object) -> None:
        raise RuntimeError("a bug in the runner")

    monkeypatch.setattr(SidecarServer, "_answer", broken)  # noted there, the request refused
    with pytest.raises(BoundaryError, match="a bug in the runner"):
        space.read_file("report.json", 100)
    assert worker.take() == {"sidecar": 1} and worker.total == {"tree_kill": 1, "sidecar": 1}


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner)))
@settings(max_examples=300)
def test_faults_handed_over_are_counted_only_as_guards_and_bounded_counts(
        counts: object) -> None:
    faults = Faults()
    faults.adopt(counts)
    taken = faults.take()
    assert all(g in GUARDS and 0 < n <= MAX_ADOPTED for g, n in taken.items())
    if isinstance(counts, dict):
        assert taken == {g: n for g, n in counts.items() if g in GUARDS and type(n) is int
                         and 0 < n <= MAX_ADOPTED}

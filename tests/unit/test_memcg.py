"""Finding a command's memory cgroup and reading what the out-of-memory killer did in it:
cgroup v1 and v2 layouts, a container's view (its own cgroup at the root) and a machine's
(the path from /proc/self/cgroup), and whatever those files might hold."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from jobfence.actions.child import Usage
from jobfence.worker import memcg


def v1_tree(root: Path, rel: str, oom_kill: int, limit: str) -> Path:
    where = root / "memory" / rel
    where.mkdir(parents=True, exist_ok=True)
    (where / "memory.oom_control").write_text(
        f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kill}\n")
    (where / "memory.limit_in_bytes").write_text(limit + "\n")
    return where


def test_v1_on_a_machine_the_process_cgroup_in_a_container_the_root(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("12:pids:/x\n4:memory:/kubepods/pod1/ctr\n1:name=systemd:/x\n")
    v1_tree(tmp_path, "", 0, "9223372036854771712")
    mine = v1_tree(tmp_path, "kubepods/pod1/ctr", 3, str(192 * 2**20))
    found = memcg.own(proc, tmp_path)
    assert found == memcg.MemoryCgroup(mine, v2=False)
    assert (found.oom_kills(), found.limit_bytes()) == (3, 192 * 2**20)
    # In a container the host's path does not exist under the mount: its root is its own.
    proc.write_text("4:memory:/elsewhere/on/the/host\n")
    at_root = memcg.own(proc, tmp_path)
    assert at_root == memcg.MemoryCgroup(tmp_path / "memory", v2=False)
    assert at_root.limit_bytes() is None  # the kernel's "unlimited"


def test_v2_reads_memory_events_and_max(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("0::/jobs/one\n")
    where = tmp_path / "jobs" / "one"
    where.mkdir(parents=True)
    (where / "memory.events").write_text("low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\n")
    (where / "memory.max").write_text("max\n")
    found = memcg.own(proc, tmp_path)
    assert found == memcg.MemoryCgroup(where, v2=True)
    assert (found.oom_kills(), found.limit_bytes()) == (2, None)
    (where / "memory.max").write_text("1073741824\n")
    assert found.limit_bytes() == 2**30


def test_no_cgroup_to_read_is_none(tmp_path: Path) -> None:
    assert memcg.own(tmp_path / "absent", tmp_path) is None
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/x\n")
    assert memcg.own(proc, tmp_path) is None  # no memory hierarchy mounted


@given(proc_text=st.binary(max_size=300), events=st.binary(max_size=200),
       limit=st.binary(max_size=40))
@settings(max_examples=200, deadline=None)
def test_whatever_the_files_hold_nothing_raises(tmp_path_factory, proc_text: bytes,  # type: ignore[no-untyped-def]
                                                events: bytes, limit: bytes) -> None:
    root = tmp_path_factory.mktemp("cg")
    (root / "memory").mkdir()
    (root / "memory" / "memory.oom_control").write_bytes(events)
    (root / "memory" / "memory.limit_in_bytes").write_bytes(limit)
    (root / "memory.events").write_bytes(events)
    (root / "memory.max").write_bytes(limit)
    proc = root / "cgroup"
    proc.write_bytes(proc_text)
    found = memcg.own(proc, root)
    if found is not None:
        kills, most = found.oom_kills(), found.limit_bytes()
        assert kills is None or isinstance(kills, int)
        assert most is None or 0 <= most < memcg.UNLIMITED


def test_usage_reports_an_oom_kill_and_reads_back_only_what_is_sound() -> None:
    used = Usage(1.5, 300 * 2**20, True, 256 * 2**20)
    assert Usage.reported(used.as_dict()) == used
    assert Usage(1.0, None).as_dict() == {"cpu_seconds": 1.0, "peak_memory_bytes": None}
    assert Usage.reported({"cpu_seconds": 1, "oom_killed": "yes"}) == Usage(1.0, None)
    assert Usage.reported({"cpu_seconds": 1, "oom_killed": True,
                           "memory_limit_bytes": -1}) is None

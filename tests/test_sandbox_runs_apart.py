"""No run reaches a later one through its server, and no innocent job is blamed for another's.

A program can leave memory charged to its server's cgroup after every one of its processes is
gone: pipes (or memory files, or data) sent over a Unix socket that travels in its own queue are
freed only by the kernel's collection of in-flight sockets, which nothing sets off by itself.
Unfreed, that memory counts against the next run's ``memory_mb`` (a correct program is killed),
and a next job asking for less than what is left made its server die while preparing it (the
limit write fails), the innocent job blamed. Every program also starts as the OOM killer's first
choice.
"""

from __future__ import annotations

import os
import textwrap
import time

import pytest

from llm_zoo import sandbox
from llm_zoo.sandbox import cgroup, pool, runner, server
from test_sandbox_hostile import SETUPS, make_box

# Sends ``count`` pipes, each holding 1 MiB, over a Unix socket that travels in its own queue: once
# the program ends, only the kernel's collection of in-flight sockets can free them.
POISON = textwrap.dedent(
    """
    import array, fcntl, os, socket, sys
    count = int(sys.stdin.read())
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    held = 0
    for _ in range(count):
        r, w = os.pipe()
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
        os.set_blocking(w, False)
        try:
            while True:
                held += os.write(w, b"x" * 65536)
        except BlockingIOError:
            pass
        a.sendmsg([b"!"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r, b.fileno()]))])
        os.close(r)
        os.close(w)
    a.close()
    b.close()
    print(held >> 20)
    """
)
VICTIM = "block = bytearray(36 << 20)\nprint('victim', len(block) >> 20)\n"


@pytest.fixture(params=SETUPS)
def box(request):
    """One server (``workers=1``), so the run after the poison runs where the poison ran."""
    with pytest.MonkeyPatch.context() as patch, make_box(request.param, patch, workers=1) as created:
        if not created.isolation_info()["memory_total"]:
            pytest.skip("no memory cgroup here: memory left in flight is not charged to any run")
        yield created


def _left_charged(box: sandbox.Sandbox) -> list[int]:
    """What each live server's cgroup holds now, page cache aside (bytes)."""
    left = []
    for worker in list(box._workers):
        if worker.cgroup is not None and os.path.isdir(worker.cgroup.path):
            version = worker.cgroup.version
            usage = "memory.current" if version == "v2" else "memory.usage_in_bytes"
            fds = [
                os.open(os.path.join(worker.cgroup.path, name), os.O_RDONLY)
                for name in (usage, "memory.stat")
            ]
            try:
                left.append(cgroup.unreclaimable_bytes(version, *fds))
            finally:
                for fd in fds:
                    os.close(fd)
    return left


def test_memory_a_run_left_in_flight_is_not_charged_to_the_next(box):
    poison = box.run(POISON, stdin="24", timeout=20)
    assert poison.exit_code == 0 and int(poison.stdout) >= 20, poison  # at least 20 MiB in flight
    assert all(left <= server.LEFTOVER_BOUND_BYTES for left in _left_charged(box)), _left_charged(box)
    # The next correct program gets the whole of its memory_mb: 36 MiB of 64 (24 in flight would kill it).
    victim = box.run(VICTIM, memory_mb=64)
    assert victim.ok and victim.stdout == "victim 36\n", victim
    assert not victim.memory_exceeded and victim.left_behind is None


def _innocent_then_poisoners(innocent: int, poisoners: int) -> list[sandbox.Job]:
    """Innocent jobs asking for 16 MiB (less than a poisoner leaves), then poisoners. A batch
    is cut into chunks of every k-th job, so each server runs an innocent job, then a poisoner,
    then the next chunk's innocent job: the one the poison was waiting for."""
    jobs = [sandbox.Job(f"print({i})", memory_mb=16) for i in range(innocent)]
    return jobs + [sandbox.Job(POISON, stdin="24", timeout=20) for _ in range(poisoners)]


def _assert_innocent_results(jobs: list[sandbox.Job], results: list[sandbox.RunResult]) -> None:
    for index, (job, result) in enumerate(zip(jobs, results, strict=True)):
        if job.code == POISON:
            assert result.exit_code == 0 and result.error is None, result  # it did nothing forbidden
        else:
            assert result.ok and result.stdout == f"{index}\n" and result.error is None, (index, result)


def test_a_job_asking_less_memory_than_a_poisoner_left_is_not_blamed(box):
    """On one server: the innocent job after a poison asks for less than was left in flight. It
    must run, once, and get its own result, not "the program's sandbox server died twice"."""
    jobs = _innocent_then_poisoners(2, 2)
    _assert_innocent_results(jobs, box.run_many(jobs))


@pytest.mark.parametrize("setup", SETUPS)
def test_a_poisoner_in_a_parallel_batch_costs_no_innocent_job_its_result(setup, monkeypatch):
    """Two servers, a batch of innocent jobs and poisoners: every innocent job gets its own
    result, whichever server it lands on, its rerun included."""
    with make_box(setup, monkeypatch, workers=2) as box:
        if not box.isolation_info()["memory_total"]:
            pytest.skip("no memory cgroup here")
        jobs = _innocent_then_poisoners(4, 4)
        _assert_innocent_results(jobs, box.run_many(jobs))


def test_a_refused_memory_limit_is_reported_before_the_job_starts():
    """The server's side: a limit file that refuses the write raises ``LimitRefused`` (the server
    then retires before the job, which the host runs elsewhere), and the next write retries."""
    read_only = os.open(os.devnull, os.O_RDONLY)
    events = os.open(os.devnull, os.O_RDONLY)
    config = server.ServerConfig(
        {"uid": -1, "keep_read_search": False, "cleanup": "tree", "scratch": "/tmp",
         "memory_fds": [read_only], "memory_events_fd": events}
    )  # fmt: skip
    limit = server.MemoryLimit(config)
    try:
        with pytest.raises(server.LimitRefused, match="refused a limit of 16 MiB"):
            limit.set(16 << 20)
        assert limit.current is None
    finally:
        os.close(read_only)
        os.close(events)


@pytest.mark.parametrize("setup", SETUPS)
def test_programs_are_the_oom_killers_first_choice(setup, monkeypatch):
    with make_box(setup, monkeypatch, workers=1) as box:
        result = box.run(
            textwrap.dedent(
                """
                import os
                print(open("/proc/self/oom_score_adj").read().strip())
                try:
                    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
                    os.write(fd, b"-1000")
                    print("lowered")
                except OSError:
                    print("refused")
                """
            )
        )
    start, lowered = result.stdout.split()
    assert start == str(runner.OOM_SCORE_ADJ) == "1000", result
    assert lowered == "refused", result  # -1000 needs CAP_SYS_RESOURCE, which no program holds


# The header a stand-in server answers for a program that ran and exited 0.
_RAN = {"exit_code": 0, "timed_out": False, "duration_s": 0.0, "cpu_s": 0.0, "output_truncated": False}


class _RefusingThenWorkingServer:
    """Stands in for a server: the first ever started retires before its first job (its cgroup
    refused the limit); the others answer every job."""

    started = 0

    def __init__(self, plan, disk_mb) -> None:
        type(self).started += 1
        self.refusing = type(self).started == 1
        self.refused: str | None = None
        self.alive = True

    def execute(self, payloads):
        if self.refusing:
            self.refused = "the run cgroup refused a limit of 16 MiB: Device or resource busy"
            self.alive = False
            return [], True
        return [(dict(_RAN), code, b"") for _, code, _ in payloads], False

    def close(self, *args, **kwargs) -> None:
        self.alive = False

    kill = abandon = close


def test_a_server_that_retires_before_a_job_costs_that_job_nothing(monkeypatch):
    """The host's side: no result, ``retire`` from the server means the jobs never ran; they run on
    another server, with no error, and nobody is blamed."""
    monkeypatch.setattr(pool, "Worker", _RefusingThenWorkingServer)
    monkeypatch.setattr(_RefusingThenWorkingServer, "started", 0)
    with sandbox.Sandbox("rlimits", workers=1) as box:
        results = box.run_many([sandbox.Job(f"print({i})", memory_mb=16) for i in range(3)])
    assert [(r.stdout, r.error) for r in results] == [
        ("print(0)", None),
        ("print(1)", None),
        ("print(2)", None),
    ]
    assert _RefusingThenWorkingServer.started == 2


class _DyingOnceServer:
    """Stands in for a server: the first dies while running the job that prints "die"; every
    server records the jobs it ran."""

    instances: list[_DyingOnceServer] = []

    def __init__(self, plan, disk_mb) -> None:
        self.ran: list[bytes] = []
        self.refused = None
        self.alive = True
        type(self).instances.append(self)

    def execute(self, payloads):
        replies = []
        for _, code, _ in payloads:
            self.ran.append(code)
            if code == b"print('die')" and self is type(self).instances[0]:
                self.alive = False
                raise pool.WorkerDied("killed from outside", started=len(replies) + 1)
            replies.append((dict(_RAN), code, b""))
        return replies, False

    def close(self, *args, **kwargs) -> None:
        self.alive = False

    kill = abandon = close


def test_a_suspects_rerun_gets_a_server_that_ran_nothing_else(monkeypatch):
    """A server that other jobs used may carry what they left: the rerun that decides whether a
    job killed its server runs on a new one."""
    monkeypatch.setattr(pool, "Worker", _DyingOnceServer)
    monkeypatch.setattr(_DyingOnceServer, "instances", [])
    with sandbox.Sandbox("rlimits", workers=1) as box:
        # Chunks of every other job: the first holds the jobs 0, 2, 4, 6, and job 0 kills its server.
        jobs = [sandbox.Job("print('die')")] + [sandbox.Job(f"print({i})") for i in range(1, 8)]
        results = box.run_many(jobs)
    assert [r.error for r in results] == [None] * 8
    histories = [server.ran for server in _DyingOnceServer.instances]
    rerun_by = [ran for ran in histories[1:] if b"print('die')" in ran]
    assert len(rerun_by) == 1 and rerun_by[0][0] == b"print('die')", histories


# ------------------------------------------------------------------ channels from one run to the next
_FORKER = "import os\nfor _ in range(int(input())):\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)\n"
_PIDS = (
    "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nprint(os.getpid(), pid)"
)


def _isolated_as_root(box: sandbox.Sandbox) -> bool:
    info = box.isolation_info()
    return info["namespaces"] and info["uid_drop"]


@pytest.mark.parametrize("setup", SETUPS)
def test_a_programs_pid_says_nothing_of_what_earlier_runs_forked(setup, monkeypatch):
    """A run forks k processes; the next reads its pid: the same whatever k, where the sandbox
    says the channel is closed (and it is closed with namespaces as root)."""
    with make_box(setup, monkeypatch, workers=1) as box:
        seen = set()
        for forks in (0, 7, 120):
            box.run(_FORKER, stdin=str(forks))
            seen.add(box.run(_PIDS).stdout)
        claim = box.isolation_info()["channels_between_runs"].get("pid_counter", "open")
    assert claim.startswith("closed") == (len(seen) == 1), (claim, seen)
    if _isolated_as_root(box):
        assert len(seen) == 1, seen


@pytest.mark.parametrize("setup", SETUPS)
def test_programs_do_not_see_their_server_or_zygote(setup, monkeypatch):
    """The zygote's /proc/<pid>/stat counts the page faults and CPU time of every run it reaped."""
    program = (
        "import os\nvisible = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print(os.path.exists(f'/proc/{os.getppid()}/stat'), visible == [os.getpid()])"
    )
    with make_box(setup, monkeypatch, workers=1) as box:
        result = box.run(program)
        claim = box.isolation_info()["channels_between_runs"].get("server_proc_stat", "open")
    hidden = result.stdout == "False True\n"
    assert claim.startswith("closed") == hidden, (claim, result)
    if _isolated_as_root(box):
        assert hidden, result


@pytest.mark.parametrize("setup", SETUPS)
def test_the_hosts_fork_counter_says_nothing_of_what_earlier_runs_forked(setup, monkeypatch):
    """/proc/stat counts every fork on the host since boot (an outside corpus sent 4 bits a run
    through it, to other servers too): programs cannot open it where the sandbox says the channel
    is closed (namespaces as root), and the standard library still counts the CPUs."""
    program = (
        "import os\ndef size(path):\n    try:\n        return len(open(path).read())\n"
        "    except PermissionError:\n        return 'refused'\n"
        "print([size(p) for p in ('/proc/stat', '/proc/vmstat')], (os.cpu_count() or 0) >= 1)"
    )
    with make_box(setup, monkeypatch, workers=1) as box:
        result = box.run(program)
        channels = box.isolation_info()["channels_between_runs"]
    assert result.ok and result.stdout.endswith(" True\n"), result
    masked = result.stdout.startswith("['refused', 'refused']")
    assert channels.get("host_event_counters", "open").startswith("closed") == masked, (channels, result)
    if _isolated_as_root(box):
        assert masked, result
        assert channels["page_cache"].startswith("open") and channels["socket_inode_numbers"].startswith(
            "open"
        )


@pytest.mark.parametrize("run_tmp", ["0", "1"])
@pytest.mark.parametrize("setup", SETUPS)
def test_inode_numbers_say_nothing_of_what_earlier_runs_made(setup, run_tmp, monkeypatch):
    """A run makes k files; the next reads the inode numbers of its work dir and of a new file:
    the same whatever k where the sandbox says the channel is closed: with namespaces as root and
    ``LLM_ZOO_SANDBOX_RUN_TMP=1`` (a tmpfs per run); open, and said so, without it."""
    monkeypatch.setenv("LLM_ZOO_SANDBOX_RUN_TMP", run_tmp)
    maker = "for i in range(int(input())):\n    open(f'f{i}', 'w').close()\n"
    reader = "import os\nopen('x', 'w').close()\nprint(os.stat('.').st_ino, os.stat('x').st_ino, sorted(os.listdir('.')))"
    with make_box(setup, monkeypatch, workers=1) as box:
        seen = set()
        for files in (0, 40, 2000):
            assert box.run(maker, stdin=str(files)).ok
            seen.add(box.run(reader).stdout)
        claim = box.isolation_info()["channels_between_runs"].get("tmp_inode_numbers", "open")
    assert claim.startswith("closed") == (len(seen) == 1), (claim, seen)
    if _isolated_as_root(box) and run_tmp == "1":
        assert len(seen) == 1, seen
        assert next(iter(seen)).endswith("['main.py', 'x']\n")  # nothing of the earlier runs' files


def test_leftovers_beside_a_runs_own_tmpfs_go_and_its_mount_point_stays(tmp_path):
    """Programs sharing the server's uid (a user namespace, no uid drop) can write next to the work
    dir: with a tmpfs per run those files must still go after the run, and the mount point stay."""
    config = server.ServerConfig(
        {"uid": -1, "keep_read_search": False, "cleanup": "tree", "scratch": str(tmp_path)}
    )
    os.mkdir(config.workdir)
    (tmp_path / "left by a program").write_text("for the next run")
    (tmp_path / "a dir").mkdir()
    (tmp_path / "a dir" / "inside").write_text("x")
    assert server._discard_shared_leftovers(config, deadline=time.monotonic() + 5)
    assert sorted(os.listdir(tmp_path)) == ["work"]

"""The sandbox API: results, faithfulness to ``python main.py``, batches, threads, forks, shutdown.

Hostile programs are in ``test_sandbox_hostile.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from llm_zoo import sandbox
from llm_zoo.sandbox.worker import processes_of_uid


@pytest.fixture(scope="module")
def box():
    with sandbox.Sandbox(workers=2) as created:
        yield created


def test_runs_a_program_with_stdin():
    result = sandbox.run_python("name = input()\nprint(f'hello {name}')", stdin="zoo\n", timeout=5)
    assert result.ok and result.stdout == "hello zoo\n" and result.stderr == ""
    assert result.exit_code == 0 and not result.timed_out and not result.output_truncated
    assert not result.memory_exceeded
    assert 0 < result.duration_s < 5 and result.cpu_s >= 0
    assert result.layer == sandbox.isolation_layer() and result.layer in sandbox.LAYERS


PROGRAMS = {
    "echo": ("import sys\nfor line in sys.stdin:\n    print(line.strip()[::-1])", "abc\ndef\n"),
    "exit code": ("import sys\nprint('partial', end='')\nsys.exit(3)", ""),
    "exit message": ("import sys\nsys.exit('bad input')", ""),
    "exception": ("def f():\n    return 1 / 0\nprint('x')\nf()", ""),
    "syntax error": ("print('unclosed'", ""),
    "stderr and unicode": ("import sys\nprint('Grüße ✓')\nprint('warn', file=sys.stderr)", ""),
    "no trailing newline": ("print('a', end='')", ""),
    "atexit and threads": (
        "import atexit, threading, time\natexit.register(lambda: print('bye'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.05), print('thread'))).start()\nprint('main')",
        "",
    ),
    "name and argv": (
        "import sys, os\nprint(__name__, os.path.basename(sys.argv[0]), os.path.basename(__file__))",
        "",
    ),
    "big int": ("print(len(str(7 ** 4000)))", ""),
    "eof": ("try:\n    input()\nexcept EOFError:\n    print('eof')", ""),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_behaves_like_python_main_py(box, tmp_path, name):
    """Same stdout, stderr (paths aside) and exit status as ``python -I -B main.py``."""
    code, stdin = PROGRAMS[name]
    program = tmp_path / "main.py"
    program.write_text(code)
    plain = subprocess.run(
        [sys.executable, "-I", "-B", str(program)], input=stdin, capture_output=True, text=True,
        timeout=30, cwd=tmp_path, env={"LANG": "C.UTF-8"},
    )  # fmt: skip
    ours = box.run(code, stdin=stdin, timeout=10)
    assert ours.exit_code == plain.returncode
    assert ours.stdout == plain.stdout
    workdir_program = ours.stderr.split('File "')[1].split('"')[0] if 'File "' in ours.stderr else None
    expected_stderr = plain.stderr.replace(str(program), workdir_program) if workdir_program else plain.stderr
    assert ours.stderr == expected_stderr


def test_program_starts_in_a_fresh_empty_workdir(box):
    code = "import os\nprint(sorted(os.listdir('.')), os.path.exists('state'))\nopen('state', 'w').write('x')"
    results = box.run_tests(code, [""] * 6)
    assert [r.stdout for r in results] == ["['main.py'] False\n"] * 6


REPRODUCIBLE = "import random\nprint(random.random(), hash('llm-zoo'), list({'fig', 'kiwi', 'pear', 'plum'}))"


@pytest.mark.parametrize("layer", ["auto", "rlimits"])
def test_the_same_program_prints_the_same_in_every_run_and_server(layer):
    """Rewards must not depend on a program's draws: ``random`` is seeded with 0 before each run
    and the hash seed is 0, as in ``PYTHONHASHSEED=0 python -c ...`` with ``random.seed(0)``."""
    code = REPRODUCIBLE.replace("import random\n", "import random\nrandom.seed(0)\n")
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                           env={"PYTHONHASHSEED": "0", "LANG": "C.UTF-8"})  # fmt: skip
    outputs = set()
    for _ in range(2):  # two sandboxes: their servers start apart
        with sandbox.Sandbox(layer, workers=2) as fresh:
            outputs |= {r.stdout for r in fresh.run_tests(REPRODUCIBLE, [""] * 4)}
    assert outputs == {plain.stdout}


def test_run_tests_keeps_input_order(box):
    results = sandbox.run_tests("print(int(input()) ** 2)", [str(i) for i in range(30)], timeout=5)
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(30)]


def test_run_many_applies_each_jobs_limits(box):
    jobs = [
        sandbox.Job("print(input())", stdin="fine"),
        sandbox.Job("while True: pass", timeout=0.5),
        sandbox.Job("print('x' * 5000)", max_output_bytes=100),
        sandbox.Job("x = bytearray(300 << 20)\nprint('ok')", memory_mb=200),
        sandbox.Job("x = bytearray(100 << 20)\nprint('ok')", memory_mb=400),
    ]
    fine, loop, flood, too_big, fits = box.run_many(jobs)
    assert fine.stdout == "fine\n" and fine.ok
    assert loop.timed_out and not loop.ok
    assert flood.output_truncated and len(flood.stdout) == 100
    assert too_big.exit_code == 1 and "MemoryError" in too_big.stderr and not too_big.memory_exceeded
    assert fits.ok and fits.stdout == "ok\n"
    assert sandbox.run_many([]) == []


def test_issue_acceptance_through_run_python():
    start = time.monotonic()
    loop = sandbox.run_python("while True:\n    pass", timeout=1.0)
    assert loop.timed_out and time.monotonic() - start < 2.0
    memory = sandbox.run_python("x = bytearray(4 << 30)\nprint('allocated')", memory_mb=512)
    assert memory.exit_code != 0 and "MemoryError" in memory.stderr
    flood = sandbox.run_python("print('y' * 10**6)", max_output_bytes=1000)
    assert flood.output_truncated and len(flood.stdout) == 1000
    bomb = sandbox.run_python("import os\nwhile True:\n    os.fork()", timeout=1.0, max_processes=8)
    assert bomb.exit_code != 0 and sandbox.run_python("print(1)").stdout == "1\n"


def test_cpu_time_limit_counts_as_timed_out(box):
    result = box.run("import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)")
    assert result.exit_code == -signal.SIGXCPU and result.timed_out


def test_concurrent_callers_share_a_sandbox(box):
    failures: list[str] = []

    def caller(index: int) -> None:
        for step in range(8):
            result = box.run(f"print({index} * 100 + {step})")
            if result.stdout != f"{index * 100 + step}\n":
                failures.append(repr(result))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert len(box._workers) <= box.workers


def test_a_worker_killed_twice_closes_nothing_that_is_no_longer_its_own():
    """A worker killed by hand and then found dead by the pool is killed again: the second kill
    must not close the fd numbers the first one freed (another thread may hold them by then)."""
    with sandbox.Sandbox(workers=1) as box:
        assert box.run("print(1)").ok
        (worker,) = box._workers
        worker.kill()
        reused = [os.open("/dev/null", os.O_RDONLY) for _ in range(8)]  # take the freed numbers
        try:
            worker.kill()
            for fd in reused:
                os.fstat(fd)  # EBADF if the second kill closed it
        finally:
            for fd in reused:
                os.close(fd)
        assert box.run("print(2)").stdout == "2\n"


def test_dead_server_is_replaced():
    with sandbox.Sandbox(workers=1) as box:
        assert box.run("print(1)").ok
        (worker,) = box._workers
        worker.kill()  # as if it crashed
        assert box.run("print(2)").stdout == "2\n"
        (replacement,) = box._workers
        assert replacement is not worker


def test_server_dying_during_a_chunk_is_replaced_and_the_rest_rerun():
    with sandbox.Sandbox(workers=1) as box:
        box.run("print(0)")
        (worker,) = box._workers
        victim = worker.init_pid or worker.process.pid  # bubblewrap's init takes the server with it
        threading.Timer(0.3, os.kill, (victim, signal.SIGKILL)).start()
        jobs = [sandbox.Job(f"import time\ntime.sleep(0.2)\nprint({i})") for i in range(6)]
        results = box.run_many(jobs)
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]
        assert all(r.error is None for r in results)
        assert worker not in box._workers


def test_works_in_a_forked_copy_of_the_host(box):
    assert box.run("print('parent')").ok
    parent_servers = {worker.process.pid for worker in box._workers}
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            outputs = [box.run("print('child')").stdout, sandbox.run_python("print(7)").stdout]
            os.write(write_end, json.dumps(outputs).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as handle:
        outputs = json.loads(handle.read() or "null")
    os.waitpid(pid, 0)
    assert outputs == ["child\n", "7\n"]
    assert all(worker.alive for worker in box._workers)
    assert {worker.process.pid for worker in box._workers} == parent_servers
    assert box.run("print('parent again')").stdout == "parent again\n"


def test_close_stops_every_server():
    box = sandbox.Sandbox(workers=2)
    box.run_tests("print(1)", ["", ""])
    workers = list(box._workers)
    box.close()
    assert workers and not any(worker.alive for worker in workers)
    with pytest.raises(sandbox.SandboxError, match="closed"):
        box.run("print(1)")


_HOST_SCRIPT = """
import json, os, signal, sys
from llm_zoo import sandbox
box = sandbox.Sandbox(workers=2)
box.run_tests("print(1)", ["", ""])
print(json.dumps({"servers": [w.process.pid for w in box._workers],
                  "uids": [w.lease.uid for w in box._workers if w.lease]}), flush=True)
if sys.argv[1] == "crash":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("ending", ["exit", "crash"])
def test_servers_end_with_the_host(ending):
    """At interpreter exit (atexit), and when the host is killed (servers see end of file)."""
    host = subprocess.run(
        [sys.executable, "-c", _HOST_SCRIPT, ending], capture_output=True, text=True, timeout=120
    )
    info = json.loads(host.stdout.splitlines()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(process_alive(pid) for pid in info["servers"]):
        time.sleep(0.05)
    assert not any(process_alive(pid) for pid in info["servers"])
    assert all(processes_of_uid(uid) == [] for uid in info["uids"])


def process_alive(pid: int) -> bool:
    """``pid`` runs (exists and is not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


def test_layer_can_be_forced_by_environment(monkeypatch):
    monkeypatch.setenv(sandbox.LAYER_ENV_VAR, "rlimits")
    assert sandbox.isolation_layer() == "rlimits"
    assert sandbox.run_python("print(1)").layer == "rlimits"
    info = sandbox.isolation_info()
    assert info["layer"] == "rlimits" and info["network_cut"] is info["namespaces"]


def test_unknown_layer_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown sandbox layer 'docker'.*bubblewrap, rlimits, auto"):
        sandbox.Sandbox("docker")


def test_without_bubblewrap_auto_falls_back_and_forcing_it_fails(tmp_path):
    script = textwrap.dedent(
        """
        from llm_zoo import sandbox
        print(sandbox.isolation_layer())
        try:
            sandbox.isolation_layer("bubblewrap")
        except sandbox.SandboxError as exc:
            print(exc)
        """
    )
    env = dict(os.environ, PATH=str(tmp_path))  # no bwrap on this PATH
    env.pop(sandbox.LAYER_ENV_VAR, None)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    layer, message = out.stdout.splitlines()[:2]
    assert layer == "rlimits" and "bubblewrap is not installed" in message


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"timeout": 0}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"memory_mb": 1}, "memory_mb"),
        ({"max_output_bytes": -1}, "max_output_bytes"),
        ({"max_processes": 0}, "max_processes"),
    ],
)
def test_bad_limits_are_clear_errors(kwargs, error):
    with pytest.raises(ValueError, match=error):
        sandbox.Job("print(1)", **kwargs)


def test_bad_arguments_are_clear_errors(box):
    with pytest.raises(TypeError, match="str"):
        sandbox.Job(b"print(1)")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Job"):
        box.run_many(["print(1)"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="workers"):
        sandbox.Sandbox(workers=0)


def test_isolation_info_reports_the_probe():
    info = sandbox.isolation_info()
    assert info["layer"] in sandbox.LAYERS and info["notes"][0].startswith("probe:")
    if info["layer"] == "bubblewrap":
        assert info["network_cut"] and info["read_only_root"] and info["leftover_cleanup"] == "pidns"
    assert info["uid_drop"] == (os.geteuid() == 0)


@pytest.mark.slow
def test_many_runs_stay_correct_under_load():
    adder, exiter, looper = (
        "print(sum(map(int, input().split())))",
        "import sys\nsys.exit(int(input()) % 7)",
        "while 1: pass",
    )
    jobs = []
    for i in range(600):
        code, stdin = [(adder, f"{i} {i}"), (exiter, str(i)), (looper, "")][i % 3]
        jobs.append(sandbox.Job(code, stdin=stdin, timeout=0.5))
    for i, result in enumerate(sandbox.run_many(jobs)):
        if i % 3 == 0:
            assert result.ok and result.stdout == f"{2 * i}\n"
        elif i % 3 == 1:
            assert result.exit_code == i % 7 and not result.timed_out
        else:
            assert result.timed_out


def test_a_run_cancelled_while_it_waits_for_a_server_stops_waiting():
    """Jobs queued behind other callers' runs give up when their caller cancels, rather than
    waiting their turn: an env server's abandoned steps held their client's next make 157 s."""
    event = threading.Event()
    with sandbox.Sandbox(workers=1) as box:
        box.run("print(0)")  # the server is up
        busy = threading.Thread(target=box.run, args=("import time\ntime.sleep(4)",), kwargs={"timeout": 10})
        busy.start()
        time.sleep(0.5)  # the only server now runs the sleeper
        outcome: dict = {}

        def queued() -> None:
            with sandbox.cancel_when(event):
                outcome["results"] = box.run_many([sandbox.Job("print(1)")] * 4)
                outcome["single"] = box.run("print(2)")
            outcome["at"] = time.monotonic()

        waiter = threading.Thread(target=queued)
        waiter.start()
        time.sleep(0.5)
        cancelled_at = time.monotonic()
        event.set()
        waiter.join(timeout=10)
        assert time.monotonic() - cancelled_at < 2 and busy.is_alive()  # the sleeper still runs
        assert outcome["at"] - cancelled_at < 1.5
        assert {r.error for r in outcome["results"]} == {sandbox.CANCELLED}
        assert outcome["single"].error == sandbox.CANCELLED
        busy.join()
        assert box.run("print(3)").stdout == "3\n"


def test_a_cancelled_caller_s_running_programs_are_killed():
    """A program already running for a caller that cancels is killed with its server, rather than
    left to its limits (under load, minutes of wall time); the pool goes on with a new server."""
    event = threading.Event()
    outcome: dict = {}
    with sandbox.Sandbox(workers=1) as box:

        def cancelled() -> None:
            with sandbox.cancel_when(event):
                outcome["result"] = box.run(
                    "import time\nprint('started', flush=True)\ntime.sleep(30)", timeout=60
                )
            outcome["at"] = time.monotonic()

        runner = threading.Thread(target=cancelled)
        runner.start()
        time.sleep(1.0)
        cancelled_at = time.monotonic()
        event.set()
        runner.join(timeout=20)
        assert outcome["at"] - cancelled_at < 2, outcome
        assert outcome["result"].error == sandbox.CANCELLED
        assert box.run("print(3)").stdout == "3\n"


def test_runs_of_a_cancelled_caller_are_not_started():
    """llm_zoo.sandbox.cancel_when: once the caller's event is set, jobs not yet sent to a server
    get the CANCELLED error at once; the mark is the calling thread's only."""
    event = threading.Event()
    with sandbox.Sandbox(workers=1) as box:
        with sandbox.cancel_when(event):
            assert box.run("print(1)").stdout == "1\n"
            event.set()
            started = time.monotonic()
            results = box.run_many([sandbox.Job("import time\ntime.sleep(5)")] * 4)
            single = box.run("print(2)")
            assert time.monotonic() - started < 2
        assert {r.error for r in results} == {sandbox.CANCELLED} and single.error == sandbox.CANCELLED
        assert box.run("print(3)").stdout == "3\n"  # outside the block the event means nothing

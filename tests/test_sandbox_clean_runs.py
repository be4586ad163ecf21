"""Every run starts clean and ends in bounded time, on every setup (bubblewrap, the fallback with
namespaces, the plain fallback): nothing a run leaves on its work dir (extended attributes, a
default ACL, memory charged for them) reaches the next run; cleanup never recurses and never costs
much beyond the run's limit; a server that dies loses only the job that killed it; seccomp cuts
socket families and kernel interfaces programs do not need; programs hold no capability; the
server's command line holds neither its source nor its configuration.
"""

from __future__ import annotations

import errno
import os
import signal
import struct
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from llm_zoo import sandbox
from test_sandbox_hostile import SETUPS, make_box
from test_sandbox_isolation import run


@pytest.fixture(scope="module", params=SETUPS)
def box(request):
    """One server (``workers=1``: every run of a test on the same server) per setup."""
    with pytest.MonkeyPatch.context() as patch, make_box(request.param, patch, workers=1) as created:
        yield created


# ------------------------------------------------------------------ 1. a work dir no earlier run had
def test_extended_attributes_of_a_run_are_invisible_to_the_next(box):
    left = run(
        box,
        """
        import os
        try:
            os.setxattr(".", "user.stolen_stdin", b"the secret input")
            print("set")
        except OSError as exc:
            print("refused", exc.errno)
        """,
    )
    assert left.stdout.startswith(("set", "refused"))
    seen = run(box, "import os\nprint(sorted(os.listxattr('.')))")
    assert seen.stdout == "[]\n", seen


def _default_acl_nobody_may_read() -> bytes:
    """``system.posix_acl_default`` granting nothing: user::---, group::---, other::---."""
    entries = [(0x01, 0, 0xFFFFFFFF), (0x04, 0, 0xFFFFFFFF), (0x20, 0, 0xFFFFFFFF)]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *entry) for entry in entries)


def test_a_default_acl_does_not_reach_the_next_program(box):
    left = run(
        box,
        f"""
        import os
        try:
            os.setxattr(".", "system.posix_acl_default", {_default_acl_nobody_may_read()!r})
            print("set")
        except OSError as exc:
            print("refused", exc.errno)
        """,
    )
    assert left.stdout.startswith(("set", "refused"))
    seen = run(
        box,
        """
        import os, stat
        with open("notes.txt", "w") as handle:
            handle.write("mine")
        with open("notes.txt") as handle:
            print(handle.read(), oct(stat.S_IMODE(os.stat("main.py").st_mode)), sorted(os.listxattr(".")))
        """,
    )
    assert seen.stdout == "mine 0o644 []\n", seen


def test_memory_held_by_a_runs_attributes_is_not_charged_to_later_runs(box):
    if not box.isolation_info()["memory_total"]:
        pytest.skip("no memory cgroup here: nothing to be charged to")
    run(
        box,
        """
        import os
        value, held = b"x" * 65000, 0
        try:
            while held < 200 << 20:
                os.setxattr(".", f"user.k{held}", value)
                held += len(value)
        except OSError:
            pass
        print(held >> 20)
        """,
        memory_mb=256,
        timeout=10,
    )
    for _ in range(3):
        later = run(box, "block = bytearray(150 << 20)\nblock[::4096] = b'y' * len(block[::4096])\nprint('ok')",
                    memory_mb=256, timeout=10)  # fmt: skip
        assert later.stdout == "ok\n" and not later.memory_exceeded, later


# ------------------------------------------------------------------ 2. cleanup: no recursion, bounded
_DEEP_CHAIN = """
import os
for _ in range(3000):
    os.mkdir("d")
    os.chdir("d")
print("deep")
"""


def test_a_deep_directory_chain_costs_no_other_job_its_result(box):
    jobs = [sandbox.Job(f"print({i} * 2)", timeout=5.0) for i in range(8)]
    jobs[2] = sandbox.Job(_DEEP_CHAIN, timeout=10.0)
    results = box.run_many(jobs)
    assert results[2].stdout == "deep\n" and results[2].error is None, results[2]
    for i, result in enumerate(results):
        if i != 2:
            assert result.ok and result.stdout == f"{i * 2}\n", (i, result)
    assert box.run("print(42)").stdout == "42\n"


def test_cleanup_of_a_huge_tree_stays_within_a_bounded_time(box):
    start = time.monotonic()
    result = run(
        box,
        """
        import os, time
        open("f", "w").close()
        stop, made = time.monotonic() + 1.5, 0
        while time.monotonic() < stop:
            try:
                for _ in range(500):
                    os.link("f", f"l{made}")
                    made += 1
                os.mkdir(f"d{made}")
            except OSError:
                break
        print(made)
        """,
        timeout=5.0,
    )
    beyond = time.monotonic() - start - result.duration_s
    assert int(result.stdout) > 10_000, result  # enough to take seconds to remove one by one
    assert beyond < 1.0, f"{beyond:.2f} s spent after the run ({result.stdout.strip()} links)"
    assert box.run("import os\nprint(sorted(os.listdir('.')))").stdout == "['main.py']\n"


# ------------------------------------------------------------------ 3. a dead server loses one job
def test_a_server_death_loses_only_the_job_that_caused_it(box):
    """The job running when its server dies every time it runs gets an error; the rest succeed."""
    culprit = textwrap.dedent(
        """
        import ctypes, time
        ctypes.CDLL(None).prctl(15, b"llmzoo-culprit", 0, 0, 0)
        time.sleep(4)
        """
    )
    jobs = [sandbox.Job(f"import time\ntime.sleep(0.05)\nprint({i})", timeout=5.0) for i in range(8)]
    jobs[3] = sandbox.Job(culprit, timeout=5.0)
    seen: set[int] = set()
    kills: list[int] = []
    stop = threading.Event()

    def kill_its_server() -> None:
        while not stop.is_set():
            for entry in os.listdir("/proc"):
                try:
                    with open(f"/proc/{entry}/comm") as handle:
                        found = entry.isdigit() and handle.read().strip() == "llmzoo-culprit"
                except OSError:
                    continue
                if found and int(entry) not in seen:
                    seen.add(int(entry))
                    for worker in list(box._workers):
                        with __import__("contextlib").suppress(OSError):
                            os.kill(worker.server_pid, signal.SIGKILL)
                    kills.append(int(entry))
            time.sleep(0.01)

    killer = threading.Thread(target=kill_its_server, daemon=True)
    killer.start()
    try:
        results = box.run_many(jobs)
    finally:
        stop.set()
        killer.join()
    assert results[3].error and "died twice" in results[3].error, results[3]
    for i, result in enumerate(results):
        if i != 3:
            assert result.ok and result.stdout == f"{i}\n", (i, result)
    assert len(kills) == 2  # once in the batch, once alone: never with the other jobs again


# ------------------------------------------------------------------ 4. seccomp: families and calls
def test_vsock_and_other_socket_families_are_refused(box):
    result = run(
        box,
        """
        import socket
        def attempt(family, kind, protocol=0):
            try:
                with socket.socket(family, kind, protocol) as s:
                    if family == socket.AF_VSOCK:
                        s.bind((socket.VMADDR_CID_ANY, 5123))
                        s.listen()
                return "ok"
            except OSError as exc:
                return exc.errno
        a, b = socket.socketpair()
        a.sendall(b"u"); assert b.recv(1) == b"u"
        print(attempt(socket.AF_VSOCK, socket.SOCK_STREAM), attempt(socket.AF_NETLINK, socket.SOCK_RAW),
              attempt(socket.AF_INET, socket.SOCK_STREAM), attempt(socket.AF_INET6, socket.SOCK_DGRAM))
        """,
    )
    vsock, netlink, inet, inet6 = result.stdout.split()
    assert vsock == netlink == str(errno.EAFNOSUPPORT), result.stdout
    families = box.isolation_info()["socket_families"]
    expected = "ok" if "AF_INET" in families else str(errno.EAFNOSUPPORT)
    assert inet == inet6 == expected, result.stdout
    assert box.isolation_info()["network_cut"]


_SYSCALL_PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(number, *args):
    result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])
    if result >= 0:
        os.close(result)
        return "ok"
    return ctypes.get_errno()
params = ctypes.create_string_buffer(120)
attr = ctypes.create_string_buffer(128)  # perf_event_attr: software event, cpu clock
attr[0:4] = (1).to_bytes(4, "little"); attr[4:8] = (128).to_bytes(4, "little")
attr[40:48] = (1 << 5 | 1 << 6).to_bytes(8, "little")  # exclude_kernel, exclude_hv
bpf_attr = ctypes.create_string_buffer(128)
print(call(425, 4, ctypes.addressof(params)), call(298, ctypes.addressof(attr), 0, -1, -1, 0),
      call(323, 1), call(321, 0, ctypes.addressof(bpf_attr), 128), call(447, 0))
"""


def test_kernel_interfaces_programs_do_not_need_are_refused(box):
    if os.uname().machine != "x86_64":
        pytest.skip("the probe uses x86_64 system call numbers")
    result = run(box, _SYSCALL_PROBE)
    io_uring, perf, userfaultfd, bpf, memfd_secret = result.stdout.split()
    assert io_uring == str(errno.ENOSYS), result.stdout
    assert perf == userfaultfd == bpf == memfd_secret == str(errno.EPERM), result.stdout


# ------------------------------------------------------------------ 5. no capabilities
def test_programs_hold_no_capabilities(box):
    result = run(box, "print(open('/proc/self/status').read())")
    status = dict(line.split(":\t", 1) for line in result.stdout.splitlines() if ":\t" in line)
    assert int(status["CapInh"], 16) == 0 and int(status["CapAmb"], 16) == 0, status
    kept = 1 << 2 if box.isolation_info()["keep_read_search"] else 0  # CAP_DAC_READ_SEARCH
    assert int(status["CapPrm"], 16) == int(status["CapEff"], 16) == kept, status


# ------------------------------------------------------------------ 6. no source on a command line
def test_the_servers_command_line_holds_no_source_or_configuration(box):
    run(box, "print(1)")
    (worker,) = box._workers
    for pid in {worker.process.pid, worker.server_pid}:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read()
        assert len(command) < 1000 and b"SOURCES" not in command and b"uid" not in command, command
    if box.isolation_info()["private_proc"]:
        inside = run(
            box,
            """
            import os
            # hidden altogether where programs see only their own processes
            length = len(open('/proc/1/cmdline', 'rb').read()) if os.path.exists('/proc/1') else -1
            print(length, open('/proc/self/mountinfo').read())
            """,
        )
        length, mounts = inside.stdout.split(" ", 1)
        assert int(length) < 200, inside.stdout
        if box.isolation_info()["channels_between_runs"]["server_proc_stat"].startswith("closed"):
            assert int(length) == -1, inside.stdout
        assert "llm_zoo_sandbox_" not in mounts and os.path.dirname(sandbox.__file__) not in mounts


# ------------------------------------------------------------------ 7. isolation_info says so
def test_isolation_info_states_the_clean_run_protections(box):
    info = box.isolation_info()
    assert ("never one an earlier run had" in info["fresh_workdir"]) != (
        "a tmpfs of its own" in info["fresh_workdir"]
    )
    assert ("a tmpfs of its own" in info["fresh_workdir"]) == info["channels_between_runs"].get(
        "tmp_inode_numbers", ""
    ).startswith("closed")
    assert 0 < info["cleanup_bound_s"] <= 1.0 and "without recursion" in info["cleanup"]
    assert "only the job it was running" in info["server_death"]
    assert info["socket_families"][0] == "AF_UNIX"
    assert ("AF_INET" in info["socket_families"]) == info["namespaces"]
    assert {"io_uring_setup", "perf_event_open", "userfaultfd", "bpf", "memfd_secret"} <= set(
        info["syscalls_refused"]
    )
    assert info["capabilities"].startswith("none in any set")
    assert "/proc/self/fd/" in info["server_command_line"]


@pytest.fixture
def memory_dir():
    """A directory on a tmpfs where there is one (a deep tree on a disk takes seconds)."""
    from llm_zoo.sandbox.cleanup import remove_tree

    path = tempfile.mkdtemp(dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    yield Path(path)
    remove_tree(path)


def test_remove_tree_keeps_no_recursion_follows_no_link_and_stops_at_its_deadline(memory_dir):
    from llm_zoo.sandbox.cleanup import remove_tree

    tmp_path = memory_dir
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    tree = tmp_path / "tree"
    tree.mkdir()
    level = os.open(tree, os.O_RDONLY)
    for _ in range(3000):  # a path longer than the kernel accepts, deeper than Python's recursion
        os.mkdir("d", dir_fd=level)
        below = os.open("d", os.O_RDONLY, dir_fd=level)
        os.close(level)
        level = below
    os.close(os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=level))
    os.close(level)
    os.symlink(outside, tree / "link")
    (tree / "locked").mkdir()
    (tree / "locked" / "f").write_text("x")
    os.chmod(tree / "locked", 0)
    assert remove_tree(str(tree)) and not tree.exists() and outside.read_text() == "keep me"

    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(3000):
        (flat / f"f{i}").touch()
    assert remove_tree(str(flat), deadline=time.monotonic() - 1) is False and flat.exists()
    assert remove_tree(str(flat)) and not flat.exists()

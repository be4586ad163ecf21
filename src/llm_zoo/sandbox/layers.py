"""Choosing and checking an isolation layer (see :mod:`llm_zoo.sandbox`).

:func:`layer_plan` decides, once per process and layer, how servers are started: bubblewrap's
namespace options, or for the fallback the server's own namespaces where this process may create
them; whether programs run under a uid of their own; whether runs get a memory cgroup. Each plan is
checked by starting a real server and running a probe program in it before it is used. A fallback
that cannot isolate something says so once, loudly (a :class:`SandboxWarning`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import threading
import warnings

from llm_zoo.sandbox import cgroup, seccomp
from llm_zoo.sandbox.cleanup import BUDGET_S as CLEANUP_BUDGET_S
from llm_zoo.sandbox.jail import RUN_TMP_INODES
from llm_zoo.sandbox.server import LEFTOVER_BOUND_BYTES
from llm_zoo.sandbox.worker import RUN_TMP_ENV_VAR, LayerPlan, SandboxError, Worker

LAYERS = ("bubblewrap", "rlimits")
LAYER_ENV_VAR = "LLM_ZOO_SANDBOX_LAYER"
NAMESPACES_ENV_VAR = "LLM_ZOO_SANDBOX_NAMESPACES"  # "0": the fallback does not try namespaces
MEMORY_CGROUP_ENV_VAR = "LLM_ZOO_SANDBOX_MEMORY_CGROUP"  # "0": no memory cgroup
# What a root server inside bubblewrap keeps: set up and drop to the program's uid, kill its
# processes, and remove its files; every other capability is dropped. CAP_SYS_ADMIN serves to
# remount /proc so that programs do not see the server and its zygote, and to mount each run's own
# tmpfs work dir: the server keeps it for that, its zygote drops it at start, and every program's
# process holds no capability at all. CAP_CHECKPOINT_RESTORE lets the zygote set the pid
# namespace's next pid (every program gets the same pid), where the kernel has it (5.9 and later).
_BWRAP_CAPABILITIES = (
    "CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SYS_ADMIN",
)  # fmt: skip
_CAP_CHECKPOINT_RESTORE = 40


def _kernel_knows_capability(number: int) -> bool:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as handle:
            return int(handle.read()) >= number
    except (OSError, ValueError):
        return False


class SandboxWarning(RuntimeWarning):
    """The sandbox runs with weaker isolation than the design asks for (the message says what)."""


def requested_layer(layer: str | None) -> str:
    """The layer asked for: the argument, else ``$LLM_ZOO_SANDBOX_LAYER``, else ``"auto"``."""
    choice = (layer or os.environ.get(LAYER_ENV_VAR) or "auto").strip().lower()
    if choice not in (*LAYERS, "auto"):
        raise ValueError(f"unknown sandbox layer {choice!r}; choose one of {', '.join((*LAYERS, 'auto'))}")
    return choice


_plan_lock = threading.Lock()
_plans: dict[tuple[str, str, str], LayerPlan | SandboxError] = {}


def layer_plan(layer: str | None = None) -> LayerPlan:
    """The checked plan for ``layer`` (``None``/``"auto"``: the strongest that works here).

    Raises:
        SandboxError: A layer asked for by name cannot be used here; the message says why.
    """
    choice = requested_layer(layer)
    if choice == "auto":
        try:
            return layer_plan("bubblewrap")
        except SandboxError:
            return layer_plan("rlimits")
    key = (
        choice,
        os.environ.get(NAMESPACES_ENV_VAR, "1"),
        os.environ.get(MEMORY_CGROUP_ENV_VAR, "1"),
        os.environ.get(RUN_TMP_ENV_VAR, "1"),
    )
    with _plan_lock:
        if key not in _plans:
            try:
                _plans[key] = _make_plan(choice)
            except SandboxError as exc:
                _plans[key] = exc
            else:
                _warn_about(_plans[key])  # type: ignore[arg-type]
        plan = _plans[key]
    if isinstance(plan, SandboxError):
        raise SandboxError(str(plan))
    return plan


@functools.lru_cache(maxsize=1)
def bwrap_supports_disable_userns(bwrap: str) -> bool:
    try:
        help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "--disable-userns" in help_text


def bwrap_options(bwrap: str, root: bool) -> tuple[str, ...]:
    """bubblewrap's namespace options: no network, own pid/ipc/uts namespaces, the server as pid 1."""
    if root:  # no user namespace: programs get real (leased) uids, the server a few capabilities
        args = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--cap-drop", "ALL"]
        for capability in _BWRAP_CAPABILITIES:
            args += ["--cap-add", capability]
        if _kernel_knows_capability(_CAP_CHECKPOINT_RESTORE):
            args += ["--cap-add", "CAP_CHECKPOINT_RESTORE"]
    else:
        args = [bwrap, "--unshare-all", "--unshare-user"]
        if bwrap_supports_disable_userns(bwrap):  # needs a user namespace of bubblewrap's own
            args.append("--disable-userns")
    # The server is pid 1: when it dies, the kernel kills every process of the sandbox and the
    # host sees end of file at once (bubblewrap's own init would wait for orphans). Not
    # --die-with-parent: its signal follows the host *thread* that started bubblewrap (a batch's
    # thread, gone after the batch); the server ends at end of file on its pipe instead.
    args += ["--as-pid-1", "--new-session", "--hostname", "sandbox"]
    return tuple(args)


def _memory_setting() -> tuple[tuple[str, ...], str]:
    """(the plan's ``memory`` field, a note saying why) for this process."""
    if os.environ.get(MEMORY_CGROUP_ENV_VAR, "1") == "0":
        return (), f"memory cgroup turned off (${MEMORY_CGROUP_ENV_VAR}=0)"
    found = cgroup.find_memory_hierarchy()
    if isinstance(found, str):
        return (), f"no memory cgroup: {found}"
    cgroup.remove_stale_cgroups(found[1])
    return found, f"memory cgroup {found[0]} under {found[1]}"


def _make_plan(name: str) -> LayerPlan:
    root = os.geteuid() == 0
    memory, memory_note = _memory_setting()
    if name == "bubblewrap":
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxError("bubblewrap is not installed (Debian/Ubuntu: apt-get install -y bubblewrap)")
        candidates = [LayerPlan(name, uid_drop=root, keep_read_search=False, cleanup="pidns",
                                bwrap_args=bwrap_options(bwrap, root))]  # fmt: skip
    else:
        candidates = []
        if os.environ.get(NAMESPACES_ENV_VAR, "1") != "0":
            candidates.append(
                LayerPlan(name, uid_drop=root, keep_read_search=False, cleanup="pidns", jail=True)
            )
        candidates.append(
            LayerPlan(name, uid_drop=root, keep_read_search=False, cleanup="uid" if root else "tree")
        )
    run_tmp = os.environ.get(RUN_TMP_ENV_VAR, "1") != "0"
    candidates = [dataclasses.replace(c, run_tmp=run_tmp) for c in candidates]
    failures: list[str] = []
    for candidate in candidates:
        for with_memory in [memory, ()] if memory else [()]:
            plan = dataclasses.replace(candidate, memory=with_memory)
            report = _probe(plan)
            if plan.uid_drop and report.get("stdlib_import") is not True:
                # The sandbox uid cannot read the Python installation: let it read (not write) any file.
                plan = dataclasses.replace(plan, keep_read_search=True)
                report = _probe(plan)
            problems = _probe_problems(plan, report)
            plan = dataclasses.replace(
                plan,
                fixed_pids=report.get("next_pid") == report.get("pid"),
                hidden_servers=report.get("parent_visible") is False,
                private_run_tmp=report.get("next_workdir_inode") == report.get("workdir_inode"),
                masked_host_counters=report.get("host_counters_masked") is True,
            )
            if not problems:
                notes = [f"probe: {json.dumps(report, sort_keys=True)}", memory_note, *failures]
                if plan.keep_read_search:
                    notes.append(
                        "programs keep CAP_DAC_READ_SEARCH: the Python installation is not world-readable"
                    )
                return dataclasses.replace(plan, notes=tuple(notes))
            kind = "namespaces" if plan.namespaces else "plain"
            failures.append(
                f"{kind} {'with' if plan.memory else 'without'} memory cgroup failed: {'; '.join(problems)}"
            )
    raise SandboxError(f"the {name} layer does not work here: {' | '.join(failures)}")


_PROBE_PROGRAM = r"""
import json, os, socket, sys
report = {"uid": os.getuid(), "pid": os.getpid(), "parent_visible": os.path.exists(f"/proc/{os.getppid()}"),
          "workdir_inode": os.stat(".").st_ino}
for name in ("a", "b", "c"):  # advances a shared /tmp's inode numbers: the next run shows whether it has its own
    open(name, "w").close()
child = os.fork()  # advances the pid counter: the next run's pid shows whether it is reset
if child == 0:
    os._exit(0)
os.waitpid(child, 0)
try:
    with open("/proc/stat") as counters:  # host-wide fork and CPU counters: masked when unreadable
        report["host_counters_masked"] = counters.read() == ""
except PermissionError:
    report["host_counters_masked"] = True
except OSError as exc:
    report["host_counters_masked"] = repr(exc)
try:
    import calendar  # not preloaded: needs the standard library to be readable
    report["stdlib_import"] = True
except Exception as exc:
    report["stdlib_import"] = repr(exc)
try:
    with open(os.path.join(sys.prefix, ".llm_zoo_sandbox_probe"), "w"):
        pass
    os.unlink(os.path.join(sys.prefix, ".llm_zoo_sandbox_probe"))
    report["prefix_writable"] = True
except OSError:
    report["prefix_writable"] = False
if CHECK_NETWORK:
    try:
        socket.create_connection(("192.0.2.1", 9), timeout=1).close()
        report["network"] = "connected"
    except OSError as exc:
        report["network"] = exc.strerror or repr(exc)
print(json.dumps(report))
"""


def _probe(plan: LayerPlan) -> dict:
    """Run the probe program through a real server of ``plan``; its report (or the failure)."""
    code = f"CHECK_NETWORK = True\n{_PROBE_PROGRAM}"  # cut by namespaces, or by seccomp's socket families
    try:
        worker = Worker(plan)
    except SandboxError as exc:
        return {"start": str(exc)}
    try:
        limits = {"timeout": 10.0, "memory_mb": 512, "max_output_bytes": 1 << 16, "max_processes": 8}
        pid_check = b"import os\nprint(os.getpid(), os.stat('.').st_ino)"
        replies, _ = worker.execute([(limits, code.encode(), b""), (limits, pid_check, b"")])
        if len(replies) != 2:
            return {"start": f"the probe never ran: {worker.refused or 'its server retired'}"}
        [(header, stdout, stderr), (_, next_pid, _)] = replies
    except SandboxError as exc:
        return {"start": str(exc)}
    finally:
        worker.close()
    try:
        report = json.loads(stdout)
        pid, inode = (int(value) for value in next_pid.split()) if len(next_pid.split()) == 2 else (-1, -1)
        return dict(report, exit_code=header["exit_code"], next_pid=pid, next_workdir_inode=inode)
    except ValueError:
        return {"exit_code": header["exit_code"], "stderr": stderr.decode(errors="replace")[-500:]}


def _probe_problems(plan: LayerPlan, report: dict) -> list[str]:
    if "start" in report:
        return [f"the server did not start: {report['start']}"]
    if report.get("exit_code") != 0:
        return [f"the probe program failed: {report}"]
    problems = []
    if report.get("stdlib_import") is not True:
        problems.append(f"programs cannot import the standard library ({report.get('stdlib_import')})")
    if plan.uid_drop and report.get("uid") == 0:
        problems.append("programs still run as root")
    if plan.namespaces and report.get("prefix_writable"):
        problems.append("the Python installation is writable inside the sandbox")
    if report.get("network") == "connected" and _network_cut(plan):
        problems.append("the network is reachable inside the sandbox")
    return problems


def _network_cut(plan: LayerPlan) -> bool:
    """A network namespace of its own, or a seccomp filter that allows only ``AF_UNIX`` sockets."""
    return plan.namespaces or seccomp.AVAILABLE


def channels_between_runs(plan: LayerPlan) -> dict[str, str]:
    """What a program can read that earlier runs on its server changed, and how many bits per run
    it carries (each open one measured by a hostile corpus: a run writes, the next reads back)."""
    channels = {
        "memory_left_charged": "closed: a run that leaves more than "
        f"{LEFTOVER_BOUND_BYTES >> 20} MiB charged after the kernel's collection of in-flight Unix sockets "
        "retires its server (the result's left_behind says so)"
        if plan.memory
        else "no memory cgroup: nothing is charged per run",
        "system_v_ipc_ids": "closed: System V IPC is refused (seccomp)"
        if seccomp.AVAILABLE
        else ("open: the id sequence of System V IPC objects, about 19 bits per run (18.6-19.5 measured)"),
    }
    if not plan.namespaces:
        channels["host"] = "open: programs share the host's pid counter, /proc and files (no namespaces)"
        return channels
    channels["pid_counter"] = (
        "closed: every program is pid 3 of its server's pid namespace, whatever earlier runs forked"
        if plan.fixed_pids
        else "open: a program's pid counts what earlier runs forked, about 14 bits per run (14.4 measured)"
    )
    channels["server_proc_stat"] = (
        "closed: programs see only their own processes in /proc (hidepid=2)"
        if plan.hidden_servers
        else "open: /proc/<zygote>/stat counts the page faults and CPU time of every run it reaped, "
        "about 12 bits per run (page faults modulo 2**14, read back within 2 pages)"
    )
    channels["host_event_counters"] = (
        "closed: programs cannot open /proc/stat and /proc/vmstat (the host's count of forks since boot, "
        "pages and faults)"
        if plan.masked_host_counters
        else "open: /proc/stat counts every fork on the host since boot; a run that forks until the count "
        "is its secret modulo 16 carried 4 bits to a later run (any server's; more with a larger modulus)"
    )
    channels["page_cache"] = (
        "open, host-wide: which pages of the shared read-only files (the interpreter, its standard "
        "library, /usr) are cached; a run that reads chosen pages carried 16 bits to a later run of "
        "another server (read back with preadv2(RWF_NOWAIT); timing reads would do the same, slower)"
    )
    channels["socket_inode_numbers"] = (
        "open, host-wide: a new socket's inode number counts the sockets made on the host, "
        "0.2-1 bit per run measured (noisy: every process on the host advances it)"
    )
    channels["tmp_inode_numbers"] = (
        "closed: every run has a tmpfs work dir of its own (inode numbers and free space start afresh; "
        f"at most {RUN_TMP_INODES} files), unmounted once the run's processes are gone"
        if plan.private_run_tmp
        else "open: the inode numbers of the work dir and of the files a program makes come from its "
        "server's /tmp, which every earlier run advanced: about 18 bits per run (17.6-18.1 measured); "
        "the default (no LLM_ZOO_SANDBOX_RUN_TMP=0) gives every run a tmpfs of its own"
    )
    return channels


def not_isolated(plan: LayerPlan) -> list[str]:
    """What ``plan`` leaves open that the sandbox contract asks to close."""
    gaps = []
    if not _network_cut(plan):
        gaps.append("the network (programs can connect to anything the host can)")
    if not plan.namespaces:
        gaps += [
            "host files (programs read every file, CAP_DAC_READ_SEARCH: the Python installation is not "
            "world-readable)"
            if plan.keep_read_search
            else "host files (programs read what their uid may read, the envs' hidden tests and answers included)",
            "other processes (programs see the host's processes and command lines in /proc)",
        ]
        if not plan.uid_drop:
            gaps.append("/tmp, /var/tmp and /dev/shm (shared with the host; not cleaned after a run)")
    if not plan.memory:
        gaps.append("total memory (memory_mb limits each process's address space; memfd and System V "
                    "shared memory are not bounded)")  # fmt: skip
    if not plan.uid_drop and plan.namespaces:
        gaps.append(
            "the server (programs run under its uid inside the sandbox: they can signal it; it is then replaced)"
        )
    elif not plan.uid_drop:
        gaps.append("the host's own processes and files (programs run under the host's uid)")
    return gaps


def _warn_about(plan: LayerPlan) -> None:
    gaps = not_isolated(plan)
    if gaps:
        message = (
            f"llm_zoo sandbox layer {plan.name!r} does NOT isolate: " + "; ".join(gaps)
            + ". Install bubblewrap and run where namespaces and a memory cgroup may be created "
            "(see llm_zoo.sandbox.isolation_info())."
        )  # fmt: skip
        warnings.warn(message, SandboxWarning, stacklevel=4)


def describe(plan: LayerPlan, requested: str) -> dict:
    """What ``plan`` protects (the keys are described by :func:`llm_zoo.sandbox.isolation_info`)."""
    if plan.memory:
        version = plan.memory[0]
        files = "memory.max, memory.swap.max 0" if version == "v2" else "memory.limit_in_bytes (+ memsw)"
        memory = f"cgroup {version} per server, limit set per run ({files}); RLIMIT_AS per process"
    else:
        memory = "RLIMIT_AS per process only"
    return {
        "layer": plan.name,
        "requested": requested,
        "namespaces": plan.namespaces,
        "network_cut": _network_cut(plan),
        "read_only_root": plan.namespaces,
        "host_files_hidden": plan.namespaces,
        "private_tmp": plan.namespaces,
        "private_proc": plan.namespaces,
        "uid_drop": plan.uid_drop,
        "keep_read_search": plan.keep_read_search,
        "leftover_cleanup": plan.cleanup,
        "memory_limit": memory,
        "memory_total": bool(plan.memory),
        "fresh_process_image": True,
        "fresh_workdir": (
            "a tmpfs of its own for every run, unmounted after it: no files, inode numbers, extended "
            "attributes, ACLs or memory charge carry over"
            if plan.private_run_tmp
            else "a new directory for every run, never one an earlier run had: no files, extended "
            "attributes, ACLs or memory charge carry over"
        ),
        "cleanup_bound_s": CLEANUP_BUDGET_S,
        "cleanup": f"without recursion, at most {CLEANUP_BUDGET_S} s after a run; a run that left more "
        + (
            "retires its server, and its private /tmp goes with its namespaces"
            if plan.namespaces
            else "retires its server, and the host removes the rest in the background before the uid is reused"
        ),
        "server_death": "loses only the job it was running: the batch's other jobs rerun on a new server; "
        "that job reruns once, alone, and gets an error if its server dies again",
        "socket_families": list(seccomp.socket_families(plan.namespaces)) if seccomp.AVAILABLE else "all",
        "syscalls_refused": [*sorted(seccomp.REFUSED), "unshare/clone with CLONE_NEWUSER"]
        if seccomp.AVAILABLE
        else [],
        "capabilities": "none in any set (effective, permitted, inheritable, ambient)"
        + (", but CAP_DAC_READ_SEARCH" if plan.keep_read_search else ""),
        "server_command_line": "the interpreter and the memory file it runs (python -s -S -B -P /proc/self/fd/N): "
        "the server's source and configuration are not on any command line",
        "keyrings": "no access (seccomp: add_key, request_key and keyctl fail)"
        if seccomp.AVAILABLE
        else "not filtered on this architecture",
        "userns_disabled": "--disable-userns" in plan.bwrap_args or seccomp.AVAILABLE,
        "channels_between_runs": channels_between_runs(plan),
        "oom_score_adj": "every program starts at 1000, the OOM killer's first choice; it cannot go below "
        "the floor of the process that started the sandbox (nor below 1000 where the child holds "
        "CAP_SYS_RESOURCE)",
        "not_isolated": not_isolated(plan),
        "notes": list(plan.notes),
    }

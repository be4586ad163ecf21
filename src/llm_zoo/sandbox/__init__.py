"""Running untrusted, model-written Python programs.

Entry points: :func:`run_python` (one program), :func:`run_tests` (one program against many
standard inputs), :func:`run_many` (any batch of :class:`Job`), or a :class:`Sandbox` of your own.
Each run gives a :class:`RunResult`. Model text is never evaluated in the host process.

How a run works
---------------
A :class:`Sandbox` keeps a pool of *fork servers*: Python processes started once with the base
interpreter as ``python -s -S -B -P /proc/self/fd/N`` (standard library only; the server's code and
configuration are in that memory file, so nothing of the package directory is needed inside the
sandbox, and no command line, which ``ps`` shows to everyone, holds them; bubblewrap too reads its
options from a memory file, ``--args``). Each server pre-imports common modules, then forks a
*zygote* before it reads any job. For each run the server writes the program as ``main.py`` in a
new, empty work dir (also ``$HOME`` and ``$TMPDIR``) that no earlier run had: nothing an earlier
run left on its directory (files, extended attributes, a default ACL, timestamps, the memory they
are charged to) carries over. It hands the zygote memory files for the job, stdin, stdout and
stderr; the zygote
forks a child that gets those and nothing else, so a program's memory never holds another job's
code, input or output, not even freed. The child enters a new session and the run's memory
cgroup, sets its limits, drops to the server's sandbox uid, installs a seccomp filter and runs the
program as ``__main__`` the way ``python -I -B main.py`` would (same stdout, stderr, exit status,
tracebacks, ``atexit`` handlers, thread joins; ``random`` is reseeded per run). No interpreter
starts per run. Batches go to the servers in parallel (one per usable CPU by default) in chunks
of up to ``MAX_CHUNK`` jobs; each job is still its own child, run after the previous one was
cleaned up. Pools are thread-safe, closed at interpreter exit, and start afresh in a forked host.

After each run the work dir is removed without recursion (a chain thousands of directories deep
is fine) and within ``cleanup_bound_s`` (0.25 s) of the run's end. A run that left more (say a
hundred thousand hard links) makes its server retire after answering: its private ``/tmp``, a
tmpfs, goes with its namespaces (without namespaces the host removes the rest in the background,
before the uid is leased again), so the host pays at most that bound and the next run a new
server's start (about 0.1 s), never seconds of removal.

A server (or zygote) that dies loses only the job it was running (a progress pipe tells the host
which): the other unfinished jobs of its chunk go to a new server. The job that was running reruns
once, *alone*, after them: a death can be the program's doing or the sandbox's own (killed from
outside, a bug), and the rerun tells them apart. If its server dies again, the program gets a
result with ``error`` ("... died twice ...") and is not run a third time; if not, the rerun's
result stands. A job whose server missed its deadline is not rerun (it would cost the whole
timeout again): its result is ``timed_out`` with ``error`` set. Two servers in a row that die
before starting any job mean the sandbox itself fails: the chunk's jobs then carry ``error``.

Isolation layers
----------------
The layer is chosen once per process, the strongest that works (each is checked by a probe
program through a real server before first use), reported by :func:`isolation_layer` and
:func:`isolation_info` (which lists what holds and, under ``not_isolated``, what does not), and
can be forced with ``layer=`` or ``$LLM_ZOO_SANDBOX_LAYER`` (``bubblewrap``, ``rlimits`` or
``auto``; asking for one that does not work raises :class:`SandboxError` saying why).

Always, in both layers:

* Limits per run: CPU seconds (``ceil(timeout)``: SIGXCPU, SIGKILL a second later; reported as
  ``timed_out``), address space per process (``memory_mb``), processes and threads
  (``max_processes``), file size (``max_output_bytes``, also the cap on stdout and stderr),
  64 open files, no core dumps, no POSIX message queues. ``PR_SET_NO_NEW_PRIVS``.
* ``memory_mb`` over all of a run's processes, memfd and System V shared memory included, where
  this process may create memory cgroups (cgroup v2 ``memory.max`` with no swap, or a v1 memory
  hierarchy; as root on most machines): the OOM killer then stops the run (``exit_code`` -9).
  Without one, only the per-process address-space limit holds (warned about once).
* A seccomp filter (``llm_zoo.sandbox.seccomp``): no kernel keyrings (they are not namespaced
  and outlive processes), no user namespaces; sockets of the families ``AF_UNIX`` only, plus
  ``AF_INET``/``AF_INET6`` where a network namespace cuts the network (so ``AF_VSOCK``, a virtual
  machine's ports to its host, netlink and packet sockets are refused everywhere, and without
  namespaces the network is cut by this filter); ``io_uring``, ``perf_event_open``,
  ``userfaultfd``, ``bpf`` and ``memfd_secret`` refused (no program of this kind needs them).
* No capabilities in any set (effective, permitted, inheritable, ambient), except
  ``CAP_DAC_READ_SEARCH`` where the Python installation is not world-readable (``keep_read_search``).
* The wall-clock ``timeout``, after which the program is killed.
* Every program starts with ``oom_score_adj`` 1000: the OOM killer's first choice. It cannot go
  below the floor of the process that started the sandbox (below 1000 only where the program's
  process was set up holding CAP_SYS_RESOURCE, as root outside containers that drop it).
* No System V IPC (seccomp: ``ENOSYS``): its id sequence would carry bits from run to run.
* No memory outlives its run: after each run the server sets off the kernel's collection of
  in-flight Unix sockets (descriptors a program sent and never received, which nothing else
  frees: pipes, memory files, socket buffers), then reads what is still charged to its memory
  cgroup; above 4 MiB (page cache aside) the server retires, and the run's result says so in
  ``left_behind``: the next run, possibly another episode's, never starts with part of its
  ``memory_mb`` taken. A server whose cgroup refuses the next job's limit retires before that job
  starts, so the job runs elsewhere and is not blamed.
* Nothing outlives a run: the zygote is a child subreaper; after the program exits or is killed,
  every process of the run is SIGKILLed and reaped, its System V IPC objects (where seccomp cannot
  refuse them) removed and its work dir removed (see above).
* As root, programs run under a uid of their own, leased per server (``2000000000 + n``, an
  exclusive ``flock`` in ``/tmp/llm_zoo_sandbox_uids``): ``RLIMIT_NPROC`` then bounds fork bombs,
  and programs cannot signal or ptrace the host, read other processes' environments or write
  root-owned files. The host's environment variables never reach a program.
* Programs are as reproducible as Python allows: the hash seed is 0 (sets of strings iterate in
  the same order in every run) and ``random`` is seeded with 0 before each program, so the same
  program given the same input prints the same output and a training run's rewards do not
  depend on a program's draws. What reads the clock or ``os.urandom``, or prints a memory
  address (``<function f at 0x7f...>``, ``id(x)``: address-space randomisation and the fork
  server's heap), still differs, and a program near its ``timeout`` may pass on an idle machine
  and be killed on a busy one.

With namespaces (layer ``"bubblewrap"``, and the ``"rlimits"`` fallback wherever this process
may create namespaces: as root, or with unprivileged user namespaces), each server runs as pid 1
of its own pid, mount, network, IPC and UTS namespaces (when it dies, everything in them dies):

* no network: only a loopback, down or unreachable (connections fail); seccomp still refuses
  every socket family but ``AF_UNIX``, ``AF_INET`` and ``AF_INET6``;
* as root, ``/proc`` shows a program only its own processes (``hidepid=2``): not the server or
  the zygote, whose counters (page faults and CPU time of every run reaped) would carry bits
  from run to run; and every program is pid 3, whatever earlier runs forked (the zygote sets the
  pid namespace's next pid before each fork, where the kernel lets it: CAP_CHECKPOINT_RESTORE);
* a minimal read-only file system: ``/usr``, ``/bin``, ``/lib*``, a few ``/etc`` files, the
  interpreter and its standard library, fresh ``/proc`` (only the sandbox's processes) and
  ``/dev``, and a private ``/tmp`` tmpfs of ``disk_mb`` MiB holding the work dir. Every
  ``site-packages``/``dist-packages`` directory and the package's own directory are covered by an
  empty tmpfs, so the envs' hidden tests, reference solutions and gold answers, the project and
  any dataset file outside ``/usr`` are not there. Programs can write only their work dir.

Bubblewrap (Debian package ``bubblewrap``) runs with ``--as-pid-1 --die-with-parent``; as root
without a user namespace, the server keeping only the capabilities to set up and clean up runs;
as a normal user with ``--disable-userns`` where bubblewrap supports it. The fallback builds the
same view itself (``unshare`` and ``pivot_root``, see ``llm_zoo.sandbox.jail``).

Without namespaces (the plain ``"rlimits"`` fallback; a :class:`SandboxWarning` names what is
not isolated), programs read every file their uid may read (with
``CAP_DAC_READ_SEARCH`` when the Python installation is not world-readable: then every file, the
envs' hidden data included) and see the host's processes in ``/proc``; work dirs are made under
``/dev/shm`` where it is a tmpfs (a new directory per run costs milliseconds on a disk); as root, what the
program's uid leaves in ``/tmp``, ``/var/tmp`` and ``/dev/shm`` is removed after each run. As a
normal user without namespaces, programs run under your uid: they can signal your processes and
read or write your files, and their leftover files and IPC objects are not removed.

What a program can still learn about the host, with namespaces: ``/proc/1/cmdline`` is the
interpreter's path, ``-I -S -B`` and ``/proc/self/fd/N``; ``/proc/self/mountinfo`` lists the
bound paths (the interpreter, its standard library, ``/usr``, a few ``/etc`` files, each at the
host path it has inside), the host's disk device and its mount options, and, under bubblewrap,
its staging directory ``/newroot``; nothing of the project, the envs' data or the host's scratch
directories. What a program can learn of *earlier runs* on its server is listed, with bits per
run, under ``isolation_info()["channels_between_runs"]``. With namespaces as root every channel of
one server is closed; two host-wide ones stay open between any two programs on the host, runs of
other servers included: the page cache of the shared read-only files (16 bits a run measured) and
socket inode numbers (under 1.1 bits); ``/proc/stat`` and ``/proc/vmstat``, whose fork and page
counters carried 4 bits a run, cannot be opened. Each run gets a new tmpfs as its work dir (``disk_mb``, at most 16384
files; inode numbers and free space start afresh: a shared ``/tmp`` carried about 18 bits a run),
unmounted once the run's processes are gone, so the server removes nothing file by file. It costs
0.1 ms a run on an idle 2-core Xeon (a trivial program 2.84 -> 2.93 ms) and about 6 ms under load
(the unmount waits for an RCU grace period); ``LLM_ZOO_SANDBOX_RUN_TMP=0`` trades the channel for it.
"""

from __future__ import annotations

from llm_zoo.sandbox.cancel import CANCELLED, cancel_when
from llm_zoo.sandbox.layers import LAYER_ENV_VAR, LAYERS, SandboxWarning

# The pool's tuning constants (CANCEL_POLL_S, DEFAULT_DISK_MB, MAX_CHUNK) stay importable from the
# package, where they were defined before the implementation moved to llm_zoo.sandbox.pool; they are
# not part of the documented API.
from llm_zoo.sandbox.pool import (
    CANCEL_POLL_S as CANCEL_POLL_S,
)
from llm_zoo.sandbox.pool import (
    DEFAULT_DISK_MB as DEFAULT_DISK_MB,
)
from llm_zoo.sandbox.pool import (
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MAX_PROCESSES,
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    Job,
    RunResult,
    Sandbox,
    default_sandbox,
    isolation_info,
    isolation_layer,
    run_many,
    run_python,
    run_tests,
)
from llm_zoo.sandbox.pool import (
    MAX_CHUNK as MAX_CHUNK,
)
from llm_zoo.sandbox.worker import SandboxError

__all__ = [
    "CANCELLED",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_MAX_PROCESSES",
    "DEFAULT_MEMORY_MB",
    "DEFAULT_TIMEOUT_S",
    "LAYERS",
    "LAYER_ENV_VAR",
    "Job",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxWarning",
    "cancel_when",
    "default_sandbox",
    "isolation_info",
    "isolation_layer",
    "run_many",
    "run_python",
    "run_tests",
]

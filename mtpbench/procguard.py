"""Run a server so that no process of it outlives mtpbench, however mtpbench ends.

``Guarded(cmd, log)`` starts a small guard process (``python -m mtpbench.procguard``) in a session of its
own, so a Ctrl-C at the terminal reaches mtpbench and not the server. The guard starts the server in a
new process group and then waits on its stdin, a pipe whose only writer is mtpbench. The pipe reaches
end-of-file when mtpbench closes it (``stop``), when mtpbench exits, and when mtpbench is killed (even by
SIGKILL: the kernel closes its descriptors), which is what Linux's ``PR_SET_PDEATHSIG`` would give, for
the whole process group rather than one child. On end-of-file the guard stops the group: SIGINT to the
server (vLLM shuts down cleanly on it), SIGTERM to the group after ``INT_GRACE_S``, SIGKILL after
``TERM_GRACE_S``. When the server exits on its own, the guard takes down what it left in its group too.

A process group id is only the group's while a member lives: once the group is empty the kernel may give
the number to a new process (and its group). So the guard does not reap the server (the group's leader)
until the rest of its group is gone: an unreaped server is a zombie that keeps its pid, so every signal
the guard sends reaches this group and no other. Then it tells mtpbench (a ``stopped`` line), and
mtpbench never signals that id again; its last-resort SIGKILL, for a guard that died or hung, goes only
to a group that still answers.

The server's stdout and stderr go to the log file, which starts with one header line naming the
command and the process group.

A worker (``run_worker``: one job in a child process that then exits, such as one vLLM engine of a sweep
point) needs no guard in between: it leads a process group of its own, and mtpbench, which holds it unreaped
until the group is killed, ends the whole group when the job is done, on a timeout, on Ctrl-C, or through
``Workers.stop()`` from another thread. Its stdin is a pipe that only mtpbench holds: at end-of-file, however
mtpbench ended (SIGKILL included), the worker ends its group itself (``end_with_parent``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import select
import sys
import time
from pathlib import Path

INT_GRACE_S = 20.0
TERM_GRACE_S = 10.0


def processes() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every live process (Linux /proc; empty elsewhere)."""
    out = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
            out.append((int(name), int(fields[1]), int(fields[2])))
    return out


def process_group_pids(pgid: int) -> set[int]:
    return {pid for pid, _, group in processes() if group == pgid}


def descendants(pid: int) -> set[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for child, parent, _ in processes():
        children.setdefault(parent, []).append(child)
    out, todo = {pid}, [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):  # gone (its number may since be someone else's)
        pass


def _exited(server: subprocess.Popen) -> bool:
    """Whether the server has exited, without reaping it (``WNOWAIT``): an unreaped server is a zombie
    that still holds its pid, which is its group's id, so the number cannot go to another process."""
    if server.returncode is not None:
        return True
    if not hasattr(os, "waitid"):  # no WNOWAIT here: reap, as poll does
        return server.poll() is not None
    try:
        return os.waitid(os.P_PID, server.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return server.poll() is not None


def _wait_group(server: subprocess.Popen, timeout: float) -> bool:
    """Wait until the server exited and the rest of its group is gone, then reap the server; True if so
    within ``timeout``. Until this returns True the server is not reaped, so its group id is still its own."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if server.returncode is not None:  # reaped already (no WNOWAIT): the old test, alive by signal 0
            if not group_alive(server.pid):
                return True
        elif _exited(server) and not process_group_pids(server.pid) - {server.pid}:
            server.wait()  # the last member: only now may the number be given away
            return True
        time.sleep(0.1)
    return False


def stop_group(server: subprocess.Popen, int_grace_s: float = INT_GRACE_S,
               term_grace_s: float = TERM_GRACE_S) -> bool:
    """SIGINT to the server, SIGTERM to its group, SIGKILL to its group, each after a grace period;
    True once the group is gone. Every signal goes out while the server is unreaped (alive or a zombie),
    so it reaches the server's group and no other."""
    pgid = server.pid  # the server leads its own group (start_new_session)
    if not _exited(server):
        os.kill(server.pid, signal.SIGINT)  # not send_signal: its poll would reap the server
    for sig, wait_s in ((signal.SIGTERM, int_grace_s), (signal.SIGKILL, term_grace_s)):
        if _wait_group(server, wait_s):
            return True
        _signal_group(pgid, sig)
    return _wait_group(server, 5.0)


def _server_preexec() -> None:
    """In the server, before exec: default signal handling (ignored signals survive exec), and SIGTERM
    should the guard itself die (Linux ``PR_SET_PDEATHSIG``; vLLM shuts down cleanly on SIGTERM)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            pass


def guard_main(log_path: str, cmd: list[str], int_grace_s: float = INT_GRACE_S,
               term_grace_s: float = TERM_GRACE_S) -> int:
    """The guard process: start ``cmd``, print its pid, stop its group at stdin EOF or when it exits."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only the pipe tells us when to stop
    with open(log_path, "ab", buffering=0) as log:
        server = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True, preexec_fn=_server_preexec)
        log.write(f"# mtpbench: server pid {server.pid}, process group {server.pid}: {' '.join(cmd)}\n".encode())
        print(server.pid, flush=True)
        fd = sys.stdin.fileno()
        while not _exited(server):  # not poll: the server stays unreaped until its group is gone
            readable, _, _ = select.select([fd], [], [], 0.2)
            if readable and not os.read(fd, 4096):  # end-of-file: mtpbench closed the pipe or is gone
                break
        if stop_group(server, int_grace_s, term_grace_s):
            try:
                print("stopped", flush=True)  # the owner must not signal the group's id any more
            except BrokenPipeError:  # the owner was killed: nobody is left to tell (and no traceback at exit)
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return server.returncode if server.returncode is not None else -9


class Guarded:
    """A command running under a guard; ``pgid`` is the server's process group."""

    def __init__(self, cmd: list[str], log_path: Path, env: dict | None = None,
                 int_grace_s: float = INT_GRACE_S, term_grace_s: float = TERM_GRACE_S):
        self.log_path = Path(log_path)
        self.log_path.write_text("")
        self.grace_s = int_grace_s + term_grace_s
        self.guard = subprocess.Popen([sys.executable, "-m", "mtpbench.procguard", str(self.log_path),
                                       str(int_grace_s), str(term_grace_s), "--", *cmd],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                      start_new_session=True)
        line = self.guard.stdout.readline().strip()
        self.pgid = int(line) if line.isdigit() else None
        self.group_gone = self.pgid is None  # once True, self.pgid may be someone else's: never signal it

    def running(self) -> bool:
        """The server is up: the guard returns as soon as the server exits."""
        return self.guard.poll() is None

    def pids(self) -> set[int]:
        """The processes of the server's group; empty once the group is gone (its id may be another's)."""
        return process_group_pids(self.pgid) if self.pgid and not self.group_gone else set()

    def stop(self) -> None:
        """Close the pipe; the guard stops the group. If the guard itself hangs, kill everything."""
        if self.guard.stdin and not self.guard.stdin.closed:
            try:
                self.guard.stdin.close()
            except OSError:
                pass
        try:
            self.guard.wait(self.grace_s + 15)
            told = self.guard.stdout.read() if self.guard.stdout and not self.guard.stdout.closed else b""
            self.group_gone |= b"stopped" in told
        except subprocess.TimeoutExpired:
            self.guard.kill()
            self.guard.wait()
        if not self.group_gone and group_alive(self.pgid):  # the guard died or hung before it was done
            _signal_group(self.pgid, signal.SIGKILL)
        self.group_gone = True
        if self.guard.stdout:
            self.guard.stdout.close()

    def log_tail(self, max_chars: int = 1200) -> str:
        """The last lines of the server log (where the error is), joined on one line."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        tail: list[str] = []
        for line in reversed([ln.strip() for ln in text.splitlines()
                              if ln.strip() and not ln.startswith("# mtpbench:")]):
            if tail and sum(len(x) + 3 for x in tail) + len(line) > max_chars:
                break
            tail.insert(0, line[-max_chars:])
        return " | ".join(tail)


# ---- workers: a child that runs one job in a process group of its own ----------------------------------

PARENT_PIPE_ENV = "MTPBENCH_WORKER_PARENT_PIPE"


class Workers:
    """The worker processes of one run with several side by side (trace-matrix). ``stop()`` (on Ctrl-C)
    kills the process group of each running one and refuses to start more."""

    def __init__(self):
        import threading

        self.stopped = False
        self._live: set[subprocess.Popen] = set()  # started and not yet reaped: each group id is still theirs
        self._lock = threading.Lock()

    def add(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._live.add(proc)
            if self.stopped:  # stop() ran while this one was starting
                _signal_group(proc.pid, signal.SIGKILL)

    def release(self, proc: subprocess.Popen) -> None:
        """Before the worker is reaped: from then on its group id may be reused, so no more signals."""
        with self._lock:
            self._live.discard(proc)

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            for proc in self._live:
                _signal_group(proc.pid, signal.SIGKILL)


def wait_exited(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait until ``proc`` exits, without reaping it (``_exited``); False after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not _exited(proc):
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


def run_worker(cmd: list[str], env: dict, timeout: float, stdout, stderr,
               workers: Workers | None = None) -> tuple[bool, int]:
    """Run ``cmd`` as a worker (see the module docstring) with ``PARENT_PIPE_ENV`` set, its output to the files
    ``stdout`` and ``stderr``: (finished within ``timeout``, its exit code). Whatever happens, nothing of its
    process group outlives this call: the group is killed while the worker is unreaped, so the id is still
    its own."""
    proc = subprocess.Popen(cmd, env={**env, PARENT_PIPE_ENV: "1"}, stdin=subprocess.PIPE, stdout=stdout,
                            stderr=stderr, start_new_session=True)
    try:
        if workers is not None:
            workers.add(proc)
        finished = wait_exited(proc, timeout)
    finally:
        if workers is not None:
            workers.release(proc)
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdin.close()
    return finished, proc.returncode


def end_with_parent() -> None:
    """In a worker started by ``run_worker``: end this process group when the parent's pipe on stdin reaches
    end-of-file (the parent exited or was killed)."""
    import threading

    if os.environ.get(PARENT_PIPE_ENV) != "1" or os.getpgrp() != os.getpid():
        return  # started some other way (by hand): nothing to watch, or a group that is not ours

    def watch() -> None:
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()


if __name__ == "__main__":
    # python -m mtpbench.procguard LOG INT_GRACE_S TERM_GRACE_S -- CMD...
    sys.exit(guard_main(sys.argv[1], sys.argv[5:], float(sys.argv[2]), float(sys.argv[3])))

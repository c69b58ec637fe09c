"""A profiling session of this process on itself: the mprof agent inside, mprof's reader
(``mprof _inprocess``) outside, as a child process.

This process makes two memory files (the ring and the agent's image) and starts the reader
with both. The reader writes the image, sets up the ring and says where the agent's entry
points are; this side loads the agent (or finds the one ``mprof record`` or ``attach``
loaded) and starts it on the ring. The reader drains the ring and keeps the samples; every
question (``get_traced_memory``, ``take_snapshot``...) is one line to its standard input,
answered on its standard output once it has read everything this process published before
asking. One session at a time per process.
"""

import atexit
import json
import os
import struct
import subprocess
import tempfile
import threading

from . import _agent
from ._binary import find_mprof

_lock = threading.RLock()
_current = None


class SessionError(RuntimeError):
    """A session could not start, or its reader failed."""


def current():
    """The running session, or None."""
    return _current


class Session:
    """One session: start it with :meth:`start`, ask with :meth:`ask`, end with :meth:`stop`."""

    def __init__(self, rate, owner, native=False, native_stacks=False, output=None,
                 max_depth=128, seed=0, focus=()):
        self.rate = rate
        self.owner = owner
        self.native = native
        self.native_stacks = native_stacks
        self.output = output
        self.max_depth = max_depth
        self.seed = seed
        self.focus = tuple(focus)
        self.python = None
        self._proc = None
        self._agent = None
        self._errors = None
        self._ask_lock = threading.Lock()
        self._pid = os.getpid()
        self.dead = None

    def _command(self, binary, ring_fd, agent_fd):
        args = [binary, "_inprocess", "--pid", str(os.getpid()), "--ring-fd", str(ring_fd),
                "--agent-fd", str(agent_fd), "--rate", str(self.rate),
                "--max-depth", str(self.max_depth), "--seed", str(self.seed)]
        if not self.native:
            args.append("--python-only")
        if self.native_stacks:
            args.append("--native")
        if self.output is not None:
            args += ["-o", os.fspath(self.output)]
        for path in self.focus:
            args += ["--focus", os.fspath(path)]
        return args

    def start(self):
        """Starts the reader and the agent; ``SessionError`` says why it could not."""
        global _current
        with _lock:
            if _current is not None:
                raise SessionError(
                    "pymprof: %s is already profiling this process; stop it first" % _current.owner
                )
            binary = find_mprof()
            ring_fd = os.memfd_create("mprof-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            agent_fd = os.memfd_create("mprof-agent.so", os.MFD_CLOEXEC)
            try:
                self._start(binary, ring_fd, agent_fd)
            finally:
                os.close(ring_fd)
                os.close(agent_fd)
            _current = self

    def _start(self, binary, ring_fd, agent_fd):
        self._errors = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            self._command(binary, ring_fd, agent_fd),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._errors,
            pass_fds=(ring_fd, agent_fd),
        )
        hello = self._reply()
        try:
            self._agent = _agent.find_or_load(agent_fd, hello["agent"])
        except BaseException:
            self._abandon()
            raise
        ret = self._agent.start(ring_fd)
        self._send("started %d" % ret)
        started = self._reply(check=False)
        if "error" in started:
            self._abandon()
            raise SessionError("pymprof: %s" % started["error"])
        self.python = started.get("python")

    def _abandon(self):
        """Ends a reader whose session did not start."""
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        self._proc.wait()

    def _send(self, line):
        try:
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            self._gone()

    def _read_exactly(self, n):
        data = self._proc.stdout.read(n)
        if data is None or len(data) < n:
            self._gone()
        return data

    def _reply(self, check=True):
        n, kind = struct.unpack("<QB", self._read_exactly(9))
        payload = self._read_exactly(n)
        if kind == ord("B"):
            return payload
        reply = json.loads(payload.decode())
        if check and "error" in reply:
            raise SessionError("pymprof: %s" % reply["error"])
        return reply

    def _reader_said(self):
        if self._errors is None:
            return ""
        self._errors.seek(0)
        return self._errors.read().decode(errors="replace").strip()

    def _gone(self):
        """The reader is gone: sampling ends here (another session may start), and the caller
        hears why."""
        global _current
        if _current is self:
            _current = None
        for pipe in (self._proc.stdin, self._proc.stdout):
            try:
                pipe.close()
            except (OSError, ValueError):
                pass
        status = self._proc.wait()
        said = self._reader_said()
        self.dead = "mprof's reader (PID %d) ended with status %s%s" % (
            self._proc.pid, status, (": " + said) if said else "")
        self._stop_agent()
        raise SessionError("pymprof: %s" % self.dead)

    def _stop_agent(self):
        if self._agent is not None and os.getpid() == self._pid:
            self._agent.stop(-1)

    def ask(self, line):
        """The reader's answer to ``line``: a dict, or the bytes of a snapshot."""
        if self.dead:
            raise SessionError("pymprof: %s" % self.dead)
        with self._ask_lock:
            self._send(line)
            return self._reply()

    def stop(self):
        """Ends the session: the agent takes its hooks out, the reader finishes the capture.
        Returns the reader's last word (samples, dropped records, the capture)."""
        global _current
        with _lock:
            if _current is self:
                _current = None
            if self.dead:
                return {}
            with self._ask_lock:
                self._stop_agent()
                self._send("stop")
                done = self._reply()
                self._proc.stdout.close()
                self._proc.stdin.close()
                self._proc.wait()
            said = self._reader_said()
            if said:
                import sys
                sys.stderr.write(said + "\n")
            self._errors.close()
            return done

    def forget(self):
        """In a forked child: the session is the parent's (the agent stopped writing to its
        ring at the fork); drop it without a word to the reader."""
        global _current
        self.dead = "the session belongs to the parent process (PID %d)" % self._pid
        for f in (self._proc.stdin, self._proc.stdout):
            try:
                f.close()
            except (OSError, ValueError):
                pass
        self._proc.returncode = 0  # never waited for here: it is the parent's child
        if _current is self:
            _current = None


def _after_fork_in_child():
    if _current is not None:
        _current.forget()


def _at_exit():
    session = _current
    if session is not None:
        try:
            session.stop()
        except SessionError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)

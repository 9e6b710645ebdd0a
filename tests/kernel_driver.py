"""Drive a real IPython kernel (jupyter_client) the way a notebook front end does."""

from __future__ import annotations

import json
import queue
import re
import sys
import time
from dataclasses import dataclass, field

from jupyter_client.manager import KernelManager

from nbdist.limits import time_scale


@dataclass
class Reply:
    status: str
    stdout: str = ""
    stderr: str = ""
    ename: str | None = None
    evalue: str | None = None
    traceback: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def error_text(self) -> str:
        return "\n".join([f"{self.ename}: {self.evalue}", *self.traceback])

    def check(self) -> "Reply":
        assert self.status == "ok", f"cell failed: {self.error_text}\nstdout: {self.stdout}\nstderr: {self.stderr}"
        return self


class KernelDriver:
    """A kernel started with this Python, executing cells with bounded timeouts (times NBDIST_TIME_SCALE)."""

    def __init__(self, cwd=None, env=None, python=None):
        self.km = KernelManager(kernel_name="python3")
        self.km.kernel_spec.argv[0] = python or sys.executable  # the venv's Python, whatever spec is installed
        kwargs = {"cwd": cwd} if cwd else {}
        if env is not None:
            kwargs["env"] = env
        self.km.start_kernel(**kwargs)
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.stray: list = []  # shell replies that belonged to no request being collected

    def stop(self):
        """Shut the kernel down as JupyterLab does (its atexit hooks release the cluster), killed if it hangs."""
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)

    @property
    def pid(self) -> int:
        """The kernel process's pid (readable while a cell runs, unlike anything asked of the kernel)."""
        return self.km.provisioner.pid

    def submit(self, code: str) -> str:
        return self.kc.execute(code)

    def collect(self, msg_id: str, timeout: float = 120, until_output=None) -> Reply:
        """Read iopub until the cell is idle (or until `until_output` text shows up); then the reply."""
        reply = Reply(status="?")
        timeout *= time_scale()
        deadline = time.time() + timeout
        started = time.time()
        while True:
            remaining = deadline - time.time()
            if remaining <= 0:
                raise TimeoutError(f"cell did not finish within {timeout} s; stdout so far: {reply.stdout[-2000:]}"
                                   f"\nstderr: {reply.stderr[-2000:]}")
            try:
                msg = self.kc.get_iopub_msg(timeout=remaining)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    reply.stdout += content["text"]
                else:
                    reply.stderr += content["text"]
                if until_output and until_output in reply.stdout + reply.stderr:
                    reply.status = "running"
                    return reply
            elif kind == "error":
                reply.ename, reply.evalue, reply.traceback = content["ename"], content["evalue"], content["traceback"]
            elif kind in ("execute_result", "display_data"):
                reply.stdout += content["data"].get("text/plain", "") + "\n"
            elif kind == "status" and content["execution_state"] == "idle":
                break
        while True:  # the reply to this request (a stray one, from a cell left early, is skipped)
            shell_reply = self.kc.get_shell_msg(timeout=max(1.0, deadline - time.time()))
            if shell_reply["parent_header"].get("msg_id") == msg_id:
                break
            self.stray.append(shell_reply)
        content = shell_reply["content"]
        reply.status = content["status"]
        if reply.status == "error" and reply.ename is None:  # UsageError: printed, not sent as an error
            reply.ename, reply.evalue, reply.traceback = content["ename"], content["evalue"], content["traceback"]
        reply.seconds = time.time() - started
        return reply

    def run(self, code: str, timeout: float = 120) -> Reply:
        return self.collect(self.submit(code), timeout)

    def value(self, expression: str, timeout: float = 60):
        """Evaluate `expression` in the kernel; it must be JSON-serialisable."""
        # between markers, in one write: a thread of the kernel's (a background run's progress) may print meanwhile
        reply = self.run(f"import json as _j, sys as _s; _s.stdout.write('@@' + _j.dumps({expression}) + '@@\\n')",
                         timeout).check()
        found = re.findall(r"@@(.*?)@@", reply.stdout, flags=re.S)
        assert found, f"no value printed for {expression!r}: {reply.stdout[-2000:]}"
        return json.loads(found[-1])

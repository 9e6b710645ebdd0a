"""What the tests share: message builders for a shard, real clusters, and bounded waits on conditions."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from nbdist import limits
from nbdist.ps import wire

KEY = wire.new_key()
W0 = {"dense/kernel": np.arange(6, dtype=np.float32).reshape(2, 3), "dense/bias": np.zeros(3, np.float32)}
SGD = {"name": "SGD", "learning_rate": 0.5}

# a training cell of the suite's `build` model (tests/conftest.py's definitions) with plain SGD
SGD_CELL = '''
model = build()
model.compile(optimizer=keras.optimizers.SGD({lr}), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size={batch}, epochs={epochs}, steps_per_epoch={steps}, shuffle={shuffle},
                    validation_data=(xt[:500], yt[:500]))
'''


# a definition cell: 1,536 Fashion-MNIST samples and a small MLP, for the virtual clock's runs
VIRTUAL_MLP = '''
import os, time, keras, numpy as np
from nbdist.datasets import fashion_mnist
(vx, vy), _ = fashion_mnist(limit=1536)
vx = vx.astype("float32").reshape(-1, 784) / 255
def vmlp():
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])
'''


TRANSFORMER = '''
def transformer(heads=4, dropout=0.0):  # two blocks of a Vision Transformer's shape (keras-io's, small), pre-norm
    inputs = keras.Input((8, 16))
    x = keras.layers.Dense(32, name="embed")(inputs)
    for i in range(2):
        h = keras.layers.LayerNormalization(name=f"ln1_{i}")(x)
        h = keras.layers.MultiHeadAttention(heads, 8, dropout=dropout, name=f"mha_{i}")(h, h)
        x = keras.layers.Add(name=f"res1_{i}")([x, h])
        h = keras.layers.LayerNormalization(name=f"ln2_{i}")(x)
        h = keras.layers.Dense(128, activation="gelu", name=f"mlp1_{i}")(h)
        x = keras.layers.Add(name=f"res2_{i}")([x, keras.layers.Dense(32, name=f"mlp2_{i}")(h)])
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax", name="head")(x))
'''  # source, so an engine's definition cell and a test here define the same model


def dies_at(pid: int, step: int) -> str:
    """Training-cell code defining the callback `DiesAt()`: engine process `pid` kills itself (SIGKILL) as step
    `step` (0-based, counted by the optimizer) begins, so its peers are inside that step's collectives: the same
    moment every run, unlike a kill from outside."""
    return f'''
import os as _os, signal as _signal
class DiesAt(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if _os.getpid() == {pid} and int(self.model.optimizer.iterations.numpy()) == {step}:
            _os.kill(_os.getpid(), _signal.SIGKILL)
'''


def script(name: str):
    """A module of scripts/ (`script("import_graph")`), loaded from its file: scripts are not a package."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def message(kind, arrays=None, **fields):
    """A message as a shard receives it: encoded and decoded under the test key."""
    return wire.decode(KEY, wire.encode(KEY, kind, arrays, **fields))


def grads(value=1.0):
    """A gradient of W0's shapes, every entry `value`."""
    return {name: np.full(w.shape, value, np.float32) for name, w in W0.items()}


# -- time -------------------------------------------------------------------------------------
def scaled(seconds: float) -> float:
    """A test's deadline under NBDIST_TIME_SCALE (a slow machine gives everything longer), as the product's."""
    return seconds * limits.time_scale()


def wait_for(condition, what: str, timeout: float = 60, every: float = 0.2, explain=None):
    """The value of `condition()` once truthy, read every `every` s; after `timeout` (scaled) the test fails
    saying what it waited for (and what `explain()` then says). The pause between reads is a polling interval,
    never a window a verdict depends on: the verdict is the condition."""
    deadline = time.monotonic() + scaled(timeout)
    pause = threading.Event()
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {scaled(timeout):.0f} s for {what}" + (f"\n{explain()}" if explain else ""))
        pause.wait(every)


def eventually(kernel, expression: str, timeout: float = 60):
    """The value of `expression` once truthy, read from the kernel (bounded)."""
    return wait_for(lambda: kernel.value(expression), f"the kernel's `{expression}`", timeout)


def within(condition, timeout: float = 60, what: str = "the condition"):
    """The value of `condition()` once truthy, read in this process (bounded)."""
    return wait_for(condition, what, timeout, every=0.05)


# -- clusters ---------------------------------------------------------------------------------
class EnginesLeftBusy(AssertionError):
    """A test (or a module's kernel) left engines of the shared cluster with work queued or running."""


@dataclass
class TestCluster:
    """A real local ipyparallel cluster the suite started, with a client; `shared`: the suite's shared one."""

    __test__ = False  # not a test class
    cluster: object
    client: object
    shared: bool

    @property
    def cluster_id(self) -> str:
        return self.cluster.cluster_id

    def __iter__(self):  # ipp_cluster, client = cluster
        return iter((self.cluster, self.client))


def start_cluster(n: int, shared: bool = False) -> TestCluster:
    """A real `n`-engine local cluster with the heartbeats nbdist gives the clusters it starts."""
    import ipyparallel as ipp

    from nbdist.cluster.cluster import HEARTBEAT_ARGS

    cluster = ipp.Cluster(n=n, cluster_id=f"nbdist-test-{uuid.uuid4().hex[:8]}",
                          controller_args=list(HEARTBEAT_ARGS), log_level=30)
    client = cluster.start_and_connect_sync()
    try:
        client.wait_for_engines(n, timeout=scaled(120), block=True)
    except BaseException:
        client.close()
        cluster.stop_cluster_sync()
        raise
    return TestCluster(cluster, client, shared)


ENGINE_LOGS = Path(__file__).resolve().parent.parent / "build" / "engine-logs"


def stop_cluster(handle: TestCluster, keep_logs: bool = False) -> None:
    """Stop the cluster; with `keep_logs` (a test on it failed) its engines' logs are first copied to
    build/engine-logs/, which ipyparallel would delete: a native death (an abort in a library's thread, the
    out-of-memory killer) leaves no Python error, only what the engine process printed."""
    try:
        handle.client.close()
    finally:
        if keep_logs:
            _keep_engine_logs(handle)
        handle.cluster.stop_cluster_sync()


def _keep_engine_logs(handle: TestCluster) -> None:
    import shutil

    ENGINE_LOGS.mkdir(parents=True, exist_ok=True)
    for log in (Path(handle.cluster.profile_dir) / "log").glob(f"ipengine-{handle.cluster_id}-*.log"):
        shutil.copy(log, ENGINE_LOGS / log.name)


def failed_since(request, before: int) -> bool:
    """Whether a test of this session failed since `before` (the session's failure count then)."""
    return request.session.testsfailed > before


def own_cluster(engines: int = 2):
    """A module fixture named `cluster`: the module's own real cluster, stopped when the module ends, also
    when a test failed. For modules that kill, interrupt, stall, restart or evict engines or shards.

        cluster = own_cluster(engines=2)
    """

    @pytest.fixture(scope="module")
    def cluster(request):
        failed_before = request.session.testsfailed
        handle = start_cluster(engines)
        try:
            yield handle
        finally:
            stop_cluster(handle, keep_logs=failed_since(request, failed_before))

    return cluster


def busy_ids(client) -> dict[int, dict]:
    """Registered engines with a task queued or running (direct `queue` or load-balanced `tasks`), and
    their status; an engine this client sent a task the hub has not counted yet is busy too (its `queue` 1)."""
    status = client.queue_status()
    busy = {eid: status[eid] for eid in sorted(client.ids)
            if eid in status and (status[eid]["queue"] or status[eid]["tasks"])}
    sent = getattr(client, "_outstanding_dict", {})  # ipyparallel's own record of what this client awaits
    for eid, engine_uuid in getattr(client, "_engines", {}).items():
        if sent.get(engine_uuid) and eid not in busy:
            busy[eid] = {**status.get(eid, {}), "queue": len(sent[engine_uuid])}
    return busy


def wait_idle(client, timeout: float) -> dict[int, dict]:
    """{} once no registered engine has a task; else, after `timeout`, the engines still busy."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        busy = busy_ids(client)
        if not busy or time.monotonic() > deadline:
            return busy
        pause.wait(0.2)


def free_engines(client, busy: dict[int, dict], timeout: float) -> str:
    """Give the shared cluster back to the next tests after one left `busy` engines: interrupt them, and kill
    those that stay busy (more engines are started when a test asks for them). Says what it did."""
    import signal

    client.send_signal(signal.SIGINT, targets=sorted(busy), block=True)
    still = wait_idle(client, timeout)
    if not still:
        return "they stopped when interrupted"
    client.send_signal(signal.SIGKILL, targets=sorted(still), block=True)
    return f"engine(s) {sorted(still)} did not stop when interrupted and were killed"


def strategy_line(name: str) -> str:
    """The magic line that runs a registered strategy on the fewest engines it takes (2 where it can), seed 1,
    on the virtual clock where it reads --simulate (a tiny cell's run is then deterministic)."""
    from nbdist.strategies import REGISTRY

    strategy = REGISTRY[name]
    workers = max(strategy.min_workers, 1 if strategy.max_workers == 1 else 2)
    virtual = ' --simulate "clock=virtual; step=2ms"' if any(o.name == "simulate" for o in strategy.reads) else ""
    return f"%%distribute --strategy {name} --workers {workers} --seed 1{virtual}\n"


# A kernel that ended releases a connected cluster's engines from its lifeline (`namespace.release`: its names,
# Keras' session, a garbage collection); after a keras-io module's runs that took over 30 s on a loaded machine.
IDLE_WAIT_S = 120


def idle_engines(cluster: TestCluster, count: int) -> list[int]:
    """`count` engines of the cluster, idle (starting more if it has fewer); their ids.

    Every engine is idle between tests (the shared cluster's guard fails a test that leaves one busy); an
    engine a test of an own cluster killed leaves the hub's list within its heartbeats."""
    client = cluster.client
    started = time.monotonic()
    busy = wait_idle(client, scaled(IDLE_WAIT_S))
    assert not busy, f"engines still busy before the test: {busy}"
    if time.monotonic() - started > 5:
        print(f"idle_engines: waited {time.monotonic() - started:.1f} s for the engines to be idle")
    missing = count - len(client.ids)
    if missing > 0:
        cluster.cluster.start_engines_sync(n=missing)
        client.wait_for_engines(len(client.ids) + missing, timeout=scaled(120), block=True)
    return sorted(client.ids)[:count]


def new_engine(cluster: TestCluster) -> tuple[int, int]:
    """One engine started now on the cluster (a test may kill it): its id and process id."""
    ipp_cluster, client = cluster
    before = set(client.ids)
    ipp_cluster.start_engines_sync(n=1)
    client.wait_for_engines(len(before) + 1, timeout=scaled(90), block=True)
    eid = (set(client.ids) - before).pop()
    return eid, client[eid].apply_sync(os.getpid)


def gate(path: str) -> str:
    """Training-cell code defining the callback `Gate()`: every worker's second step of the second epoch waits
    until the test opens the FIFO at `path` for writing (opening it to read blocks until a writer exists), so a
    test acts before the run passes there however loaded the machine (a tiny model's whole fit can end before the
    kernel's next control lands). The first epoch's end has reported progress by then. Bounded: after 300 s a
    timer opens the FIFO itself; a gate already removed lets everyone through."""
    return f'''
import os as _os, threading as _threading
class Gate(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
    def on_train_batch_begin(self, batch, logs=None):
        if self._epoch != 1 or batch != 1:
            return
        release = _threading.Timer(300, lambda: _os.close(_os.open({path!r}, _os.O_RDWR | _os.O_NONBLOCK)))
        release.start()
        try:
            _os.close(_os.open({path!r}, _os.O_RDONLY))
        except FileNotFoundError:
            pass
        finally:
            release.cancel()
'''


@contextlib.contextmanager
def paused_in_first_two_epochs(kernel, options: str, cell: str):
    """Within: `cell` (3 epochs or more, its fit's callbacks include `Gate()`) runs in the background with `options`,
    paused once it reported progress, its gate open. The pause lands in the first epoch or, at the latest, a step or
    two past the gate (the second epoch's second step, which no worker passes before the pause was sent)."""
    assert "Gate()" in cell, "the cell's fit holds the run at its gate with callbacks=[Gate()]"
    path = os.path.join(tempfile.gettempdir(), f"nbdist-gate-{uuid.uuid4().hex}")
    os.mkfifo(path)
    held = None
    try:
        kernel.run(f"%%distribute --background {options}\n" + gate(path) + cell, timeout=120).check()
        eventually(kernel, "any(p.get('epochs') for p in nbdist.last_run.progress.values())", timeout=120)
        kernel.run("nbdist.last_run.control('pause')").check()
        held = os.open(path, os.O_RDWR | os.O_NONBLOCK)  # a writer: every open to read returns, now and later
        yield
    finally:
        if held is None:  # the test failed before the gate opened: release any worker waiting there
            held = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        os.remove(path)
        os.close(held)


def join_mid_run(kernel, cluster: TestCluster, options: str, cell: str) -> tuple[dict, int, object]:
    """`paused_in_first_two_epochs`, an engine started, and once it joined, resumed to the end: the
    `worker_joined` event, the newcomer's id and `%dist wait`'s reply."""
    with paused_in_first_two_epochs(kernel, options, cell):  # the run stands still until the newcomer is in
        newcomer, _ = new_engine(cluster)
        joined, = eventually(kernel, "nbdist.last_run.events_of('worker_joined')", timeout=120)
        kernel.run("nbdist.last_run.control('resume')").check()
        reply = kernel.run("%dist wait", timeout=300).check()
    assert joined["engine"] == newcomer and joined["rank"] == 2, joined
    return joined, newcomer, reply


def dealt_by_epoch(log) -> dict[int, list]:
    """epoch -> [(worker, start, count)] of every applied push's batches (a push of local steps names each one:
    [epoch, start, count, start, count, ...])."""
    by = {}
    for entry in log:
        epoch, *ranges = entry["batch"]
        for start, count in zip(ranges[::2], ranges[1::2]):
            by.setdefault(epoch, []).append((entry["worker"], start, count))
    return by


def push_log(kernel) -> list[dict]:
    """The first shard's push log of the kernel's last run, one dict per push."""
    return kernel.value("[dict(zip(s['log_fields'], e)) for s in nbdist.last_run.ps[:1] for e in s['log']]")

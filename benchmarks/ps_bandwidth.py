"""Parameter-server push-pull against raw ZeroMQ moving the same bytes, side by side in one run.

nbdist: a real shard process (plain SGD); each round trip pushes a float32 gradient of N
values in V variables as a worker does, one flat buffer (signed header, GMAC per buffer,
layout, shape / dtype / finiteness checks, update applied) and receives the N new weights
(signed, checked). Two paths to the same shard: signed TCP (as across hosts) and the
same-host path (`nbdist.ps.same_host`: the buffers in shared memory, a signed header over a
Unix socket, the same checks and update). Run with an older nbdist on PYTHONPATH (before the flat layout), it sends
a buffer per variable, as workers did then: the same script measures the code before. Anchor: a raw ZeroMQ
ROUTER echo process that receives the same bytes and answers with as many, with no
signing, checks or update. Prints a table, then:
    RESULT ps_vs_raw_zmq_225k=<nbdist bytes/s over raw ZeroMQ bytes/s, 225,000 float32 each way>
    RESULT ps_vs_raw_zmq_10M=<the same, 10M float32 each way>
    RESULT ps_vs_raw_zmq_225k_8vars=<225,000 float32 in 8 variables (the benchmark CNN's count)>
    RESULT ps_same_host_vs_raw_zmq_225k=<the same-host path's bytes/s over raw ZeroMQ's, 225,000 float32>
    RESULT ps_same_host_vs_raw_zmq_10M=<the same, 10M float32>

    .venv/bin/python benchmarks/ps_bandwidth.py [--sizes 225000,10000000 --variables 1,8 --rounds 5 --repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import textwrap
import time

import numpy as np
import zmq

from common import print_table
from nbdist.ps import launcher, wire
from nbdist.ps.client import PsClient

try:
    from nbdist.ps.flat_layout import FlatLayout
except ImportError:  # the code before: a buffer per variable
    FlatLayout = None
try:
    from nbdist.ps import same_host  # noqa: F401
    TCP, LOCAL = {"local": False}, {"local": True}
except ImportError:  # the code before: TCP only
    TCP, LOCAL = {}, {}

RAW_ECHO = textwrap.dedent('''
    import sys, zmq
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    print(socket.bind_to_random_port("tcp://127.0.0.1"), flush=True)
    while True:
        frames = socket.recv_multipart(copy=False)
        if len(frames) == 2 and frames[1].bytes == b"stop":
            break
        socket.send_multipart(frames, copy=False)
''')


def variables(n: int, count: int) -> dict[str, np.ndarray]:
    """`n` float32 values in `count` variables of nearly equal size."""
    return {f"w{i}": np.full(len(part), 1e-3, np.float32) for i, part in enumerate(np.array_split(np.zeros(n), count))}


def time_ps(client: PsClient, gradient: dict, repeats: int) -> float:
    """Median seconds of one push-pull of `gradient` as a worker sends it."""
    version, times = 0, []
    layout = FlatLayout.of(gradient) if FlatLayout is not None else None
    for _ in range(repeats):
        t0 = time.perf_counter()
        if layout is None:
            reply = client.request("push", [gradient], version=version)[0]
        else:
            reply = client.request("push", [layout.read(gradient)], version=version, flat=layout.digest)[0]
        version = reply.header["version"]
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_raw(socket, n: int, repeats: int) -> float:
    payload = np.full(n, 1e-3, np.float32)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        socket.send_multipart([b"push", payload], copy=False)
        reply = socket.recv_multipart(copy=False)
        np.frombuffer(reply[1].buffer, np.float32)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="225000,10000000", help="float32 values per message, comma-separated "
                        "(225000: the benchmark CNN; 10000000: the headline)")
    parser.add_argument("--variables", default="1,8", help="variables the values are split into, comma-separated")
    parser.add_argument("--rounds", type=int, default=5, help="alternating nbdist / raw rounds")
    parser.add_argument("--repeats", type=int, default=20, help="round trips per round")
    args = parser.parse_args()
    cases = [(int(n), int(v)) for n in args.sizes.split(",") for v in args.variables.split(",")
             if int(v) == 1 or int(n) < 1_000_000]  # many variables matter where a message is small
    print(f"nbdist {'flat (one buffer per dtype)' if FlatLayout else 'a buffer per variable (before)'}")

    echo = subprocess.Popen([sys.executable, "-c", RAW_ECHO], stdout=subprocess.PIPE, text=True)
    context = zmq.Context()
    raw = context.socket(zmq.DEALER)
    raw.connect(f"tcp://127.0.0.1:{echo.stdout.readline().strip()}")
    rows, ratios, local_ratios = [], {}, {}
    try:
        for n, count in cases:
            gradient = variables(n, count)
            key = wire.new_key()
            shard = launcher.start_shard({"shard": 0, "workers": 1, "max_bytes": 1 << 31}, key)
            address = [f"tcp://127.0.0.1:{shard['port']}"]
            try:
                with PsClient(address, key, 0, **TCP) as client, PsClient(address, key, 0, **LOCAL) as local:
                    client.request("init", [{k: np.zeros_like(v) for k, v in gradient.items()}], trainable=list(gradient),
                                   optimizer={"name": "SGD", "learning_rate": 0.01})
                    ps_times, local_times, raw_times = [], [], []
                    for _ in range(args.rounds):
                        ps_times.append(time_ps(client, gradient, args.repeats))
                        if LOCAL:
                            local_times.append(time_ps(local, gradient, args.repeats))
                        raw_times.append(time_raw(raw, n, args.repeats))
                    client.request("stop")
            finally:
                launcher.stop_shard(shard["pid"])
            ps_s, raw_s = statistics.median(ps_times), statistics.median(raw_times)
            local_s = statistics.median(local_times) if local_times else float("nan")
            gbytes = 2 * 4 * n / 1e9
            ratios[n, count] = raw_s / ps_s
            local_ratios[n, count] = raw_s / local_s
            rows.append([f"{n:,} float32 in {count} variable{'s' * (count > 1)} each way", f"{ps_s * 1e3:.2f}",
                         f"{local_s * 1e3:.2f}", f"{raw_s * 1e3:.2f}", f"{gbytes / raw_s:.2f}", f"{ratios[n, count]:.3f}",
                         f"{local_ratios[n, count]:.3f}"])
    finally:
        raw.send_multipart([b"stop"])
        raw.close(linger=1000)
        context.term()
        echo.wait(10)
    print()
    print_table(["message", "PS over TCP ms", "PS same host ms", "raw ZeroMQ ms", "raw GB/s", "TCP ratio",
                 "same-host ratio"], rows)
    for case, label in (((225_000, 1), "225k"), ((10_000_000, 1), "10M"), ((225_000, 8), "225k_8vars")):
        if case in ratios:
            print(f"RESULT ps_vs_raw_zmq_{label}={ratios[case]:.3f}")
    for case, label in (((225_000, 1), "225k"), ((10_000_000, 1), "10M")):
        if case in local_ratios and LOCAL:
            print(f"RESULT ps_same_host_vs_raw_zmq_{label}={local_ratios[case]:.3f}")


if __name__ == "__main__":
    main()

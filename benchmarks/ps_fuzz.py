"""A mutation fuzzer against a live shard: no mutated message is applied, and the shard keeps serving.

Every message is derived from a valid push of a real shard process (plain SGD, 2 workers):
bit flips in the header, the signature or a buffer; truncated frames and buffers; duplicated
and reordered frames; the same valid push sent again (a replay); a wrong run key; and, signed
with the right key (a sender that holds it, sending junk), headers whose fields were changed
at random (kinds, versions, workers, shapes, dtypes, tags, types). Between mutations a good
push goes through every `--good-every` messages and must be applied. The anchor is the good
pushes themselves: the shard's applied count must equal them exactly. With `--same-host`
the messages take the same-host path (a signed header over the shard's Unix socket naming
arrays in a shared-memory segment): the buffer mutations become the ones that path can
suffer (a segment of another prefix, a path, one that does not exist, offsets and shapes
past the segment's end, buffer frames beside a segment). Prints a table of rejections by
reason, then:
    RESULT ps_fuzz_applied=<mutated messages the shard applied>
    RESULT ps_fuzz_crashes=<shard crashes or hangs>
    RESULT ps_fuzz_unanswered=<mutated messages that got no answer within the timeout>
    RESULT ps_fuzz_rss_growth_mb=<shard RSS growth over the run>

    .venv/bin/python benchmarks/ps_fuzz.py [--messages 10000 --seed 0] [--same-host]
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import hmac
import json
import os
import random
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import zmq

from nbdist.ps import launcher, same_host, wire

SGD = {"name": "SGD", "learning_rate": 0.01}
VARIABLES = {"dense/kernel": np.zeros((8, 4), np.float32), "dense/bias": np.zeros(4, np.float32)}
ANSWER_S = 30.0  # a bound, not a speed: a healthy shard answers in milliseconds
SHARD_LOG = os.path.join(tempfile.gettempdir(), f"nbdist-ps-fuzz-{os.getpid()}.log")  # the shard's stderr
SIGNED_FRAMES = {"header_bit": 0, "signature_bit": 1}  # a bit flipped in the header or in its signature
JUNK = [None, True, -1, 0, 2**63, 1e308, float("nan"), "", "x" * 1000, [], {}, [1, 2], {"a": 1}]


def grads() -> dict:
    return {name: np.full(v.shape, 0.01, np.float32) for name, v in VARIABLES.items()}


def sign(key: bytes, header: dict, buffers) -> list:
    text = json.dumps(header).encode()
    return [text, hmac.new(key, text, hashlib.sha256).digest(), *[bytes(b) for b in buffers]]


def flip(data: bytes, rng: random.Random) -> bytes:
    data = bytearray(data)
    if data:
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
    return bytes(data)


def junk_header(header: dict, rng: random.Random) -> dict:
    """One to three fields of the header changed, removed or added, at random."""
    header = json.loads(json.dumps(header))
    for _ in range(rng.randint(1, 3)):
        choice = rng.randrange(6)
        if choice == 0:
            header[rng.choice(list(header))] = rng.choice(JUNK)
        elif choice == 1:
            header.pop(rng.choice(list(header)), None)
        elif choice == 2:
            # kinds answered at once (a barrier or a command, such as stop, sent by a key holder is not junk)
            header["kind"] = rng.choice(["pull", "probe", "stats", "state", "heartbeat", "report", "turn",
                                         "profile", "bogus"])
            header["worker"] = rng.choice([0, 1, "controller", 5, -3, None])
        elif choice == 3 and isinstance(header.get("arrays"), list) and header["arrays"]:
            spec = rng.choice(header["arrays"])
            if not isinstance(spec, dict):
                continue
            key = rng.choice(["name", "dtype", "shape", "tag"])
            spec[key] = rng.choice([*JUNK, "object", "float64", [3, 3], [0], "00" * 16, "dense/bias"])
        elif choice == 4:
            header["version"] = rng.choice([*JUNK, 10**9, -5])
        else:
            header[rng.choice(["epoch", "logs", "share", "batch", "step", "value", "compression", "vt",
                               "since", "profile", "report", "action"])] = rng.choice(JUNK)
    return header


def mutate_local(key: bytes, rng: random.Random, worker: int, version: int, outbox, prefix: str) -> tuple[str, list]:
    """(mutation name, frames): one same-host message derived from a valid push of `worker` on `version`."""
    valid = wire.encode(key, "push", grads(), outbox=outbox, worker=worker, version=version, step=0, same_host=1)
    frames = [bytes(f) for f in valid]
    header = json.loads(frames[0])
    kind = rng.choice(["header_bit", "signature_bit", "truncate_frames", "duplicate_frame", "buffer_frame",
                       "wrong_key", "segment_name", "offset", "shape", "junk_fields"])
    if kind in SIGNED_FRAMES:
        frames[SIGNED_FRAMES[kind]] = flip(frames[SIGNED_FRAMES[kind]], rng)
    elif kind == "truncate_frames":
        frames = frames[:1]
    elif kind == "duplicate_frame":
        frames.insert(1, frames[rng.randrange(2)])
    elif kind == "buffer_frame":  # signed, but a buffer beside the segment
        frames = sign(key, header, [np.ones(4, np.float32).tobytes()])
    elif kind == "wrong_key":
        frames = [bytes(f) for f in wire.encode(wire.new_key(), "push", grads(), outbox=outbox, worker=worker,
                                                version=version, same_host=1)]
    elif kind == "segment_name":  # signed by a key holder: still only this shard's segments, by name
        header["shm"] = rng.choice([prefix.replace(prefix.split("-")[3], "0" * 16) + "w1-x-1", "../etc/passwd",
                                    "/dev/shm/" + header["shm"], prefix + "w9-nothere-1", header["shm"] + "/..",
                                    "", "x" * 300, 7, None])
        frames = sign(key, header, [])
    elif kind == "offset":
        spec = rng.choice(header["arrays"])
        spec["offset"] = rng.choice([-1, 1 << 40, outbox.segment.size, outbox.segment.size - 4, 1.5, "0", None])
        frames = sign(key, header, [])
    elif kind == "shape":
        spec = rng.choice(header["arrays"])
        spec["shape"] = rng.choice([[1 << 20], [4096, 4096], [-1], [2**62, 4], [1, 2, 3, 4, 5, 6, 7, 8]])
        frames = sign(key, header, [])
    else:
        frames = sign(key, junk_header(header, rng), [])
    return kind, frames


def mutate(key: bytes, rng: random.Random, worker: int, version: int) -> tuple[str, list]:
    """(mutation name, frames): one message derived from a valid push of `worker` computed on `version`."""
    valid = wire.encode(key, "push", grads(), worker=worker, version=version, step=0)
    frames = [bytes(f) for f in valid]
    header = json.loads(frames[0])
    kind = rng.choice(["header_bit", "signature_bit", "buffer_bit", "truncate_frames", "truncate_buffer",
                       "duplicate_frame", "reorder_buffers", "wrong_key", "junk_fields", "junk_fields"])
    if kind in SIGNED_FRAMES:
        frames[SIGNED_FRAMES[kind]] = flip(frames[SIGNED_FRAMES[kind]], rng)
    elif kind == "buffer_bit":
        i = rng.randrange(2, len(frames))
        frames[i] = flip(frames[i], rng)
    elif kind == "truncate_frames":
        frames = frames[:rng.randrange(1, len(frames))]
    elif kind == "truncate_buffer":
        i = rng.randrange(2, len(frames))
        frames[i] = frames[i][:rng.randrange(len(frames[i]))]
    elif kind == "duplicate_frame":
        i = rng.randrange(len(frames))
        frames.insert(i, frames[i])
    elif kind == "reorder_buffers":
        frames[2], frames[3] = frames[3], frames[2]
    elif kind == "wrong_key":
        frames = [bytes(f) for f in wire.encode(wire.new_key(), "push", grads(), worker=worker, version=version)]
    else:
        frames = sign(key, junk_header(header, rng), frames[2:])
    return kind, frames


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def count_answer(outcome: dict, name: str, reply: wire.Message | None, version: int) -> int:
    """Count one mutated message's answer; the shard's version after it."""
    outcome["mutations"][name] += 1
    if reply is None:
        outcome["unanswered"] += 1
        return version
    outcome["answers"][reply.header.get("reason") if reply.kind == "rejected" else reply.kind] += 1
    if reply.kind == "weights" and reply.header.get("version", version) > version:
        outcome["applied"][name] += 1  # the shard's version moved: it applied this message
        return reply.header["version"]
    return version


def fuzz(messages: int, seed: int, good_every: int, local: bool = False) -> dict:
    key, rng = wire.new_key(), random.Random(seed)
    info = launcher.start_shard({"shard": 0, "workers": 2, "heartbeat_timeout_s": 3600}, key, SHARD_LOG)
    context = zmq.Context()
    sockets = {w: context.socket(zmq.DEALER) for w in (0, 1)}
    for socket in sockets.values():
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(f"tcp://127.0.0.1:{info['port']}")
    inbox, outboxes, on_host = None, {}, {}

    def ask(worker: int, frames) -> wire.Message | None:
        socket = sockets[worker]
        socket.send_multipart(frames)
        if not socket.poll(int(ANSWER_S * 1000)):
            return None
        reply = wire.decode(key, socket.recv_multipart(), inbox=inbox)
        return wire.Message(reply.header, {k: np.array(a) for k, a in reply.arrays.items()})

    # good pushes have a session (thread) of their own: a re-signed junk header can move its session's sequence
    good_session = ThreadPoolExecutor(1)

    def good_push(**fields) -> list:
        return good_session.submit(wire.encode, key, "push", grads(), worker=0, **on_host.get(0, {}),
                                   **fields).result()

    def mutated(version: int) -> tuple[str, list]:
        if local:
            return mutate_local(key, rng, 1, version, outboxes[1], route["prefix"])
        return mutate(key, rng, 1, version)

    outcome: dict = {"mutations": collections.Counter(), "answers": collections.Counter(), "unanswered": 0,
                     "good": 0, "good_failed": 0, "applied": collections.Counter()}
    try:
        route = ask(0, wire.encode(key, "init", VARIABLES, worker=0, optimizer=SGD, trainable=list(VARIABLES),
                                   host=same_host.host_facts())).header.get("route")
        if local:  # from now on over the Unix socket, the arrays in shared memory
            if route is None:
                raise SystemExit("the shard offered no same-host route (NBDIST_PS_SAME_HOST=0, or no /dev/shm)")
            inbox = same_host.Inbox(route["prefix"])
            for w, socket in sockets.items():
                socket.close(linger=0)
                sockets[w] = context.socket(zmq.DEALER)
                sockets[w].connect(route["ipc"])
                outboxes[w] = same_host.Outbox(route["prefix"], f"w{w}-fuzz")
                on_host[w] = {"outbox": outboxes[w], "same_host": 1}
        version, rss_start = 0, rss_mb(info["pid"])
        for n in range(messages):
            if n % good_every == 0:  # the shard still serves good pushes, during and after
                last_good = good_push(version=version, step=n)
                reply = ask(0, last_good)
                outcome["good"] += 1
                if reply is None or reply.kind != "weights" or reply.header["version"] != version + 1:
                    outcome["good_failed"] += 1
                version = reply.header["version"] if reply is not None and reply.kind == "weights" else version
            name, frames = ("replay", last_good) if n % 10 == 9 else mutated(version)
            version = count_answer(outcome, name, ask(1 if name != "replay" else 0, frames), version)
        alive = launcher.exit_code(info["pid"]) is None
        final = ask(0, good_push(version=version, step=messages)) if alive else None
        outcome["good"] += 1
        outcome["good_failed"] += final is None or final.kind != "weights"
        state = ask(0, good_session.submit(wire.encode, key, "stats", worker="controller", same_host=1).result()) \
            if alive else None
        outcome.update(alive=alive and state is not None, rss_start=rss_start,
                       rss_end=rss_mb(info["pid"]) if alive else float("nan"),
                       stats=state.header if state is not None else {})
    finally:
        good_session.shutdown()
        for socket in sockets.values():
            socket.close(linger=0)
        for outbox in outboxes.values():
            outbox.close()
        if inbox is not None:
            inbox.close()
        context.term()
        launcher.stop_shard(info["pid"])
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--good-every", type=int, default=50)
    parser.add_argument("--same-host", action="store_true", help="the same-host path (shared memory, Unix socket)")
    args = parser.parse_args()
    out = fuzz(args.messages, args.seed, args.good_every, args.same_host)
    stats = out["stats"]
    applied = (stats.get("counts") or {}).get("applied", -1)
    # what holds the key and keeps the arrays valid is a push (a changed step or field the rules ignore)
    keyless = sum(n for name, n in out["applied"].items() if name != "junk_fields")
    fuzz_applied = keyless if out["alive"] else -1
    print(f"{args.messages} mutated messages (seed {args.seed}, {'same-host' if args.same_host else 'TCP'} path); "
          f"by mutation: {dict(out['mutations'])}")
    print(f"answers: {dict(out['answers'])}")
    print(f"shard rejections by reason: {stats.get('rejections')}")
    print(f"good pushes: {out['good']} sent, {out['good_failed']} not applied; shard applied {applied}; "
          f"mutated messages applied: {dict(out['applied'])} (junk_fields re-signed with the key and still "
          "a well-formed push count as good ones)")
    print(f"shard RSS: {out['rss_start']:.1f} MB -> {out['rss_end']:.1f} MB")
    print(f"RESULT ps_fuzz_applied={fuzz_applied}")
    print(f"RESULT ps_fuzz_crashes={0 if out['alive'] else 1}")
    print(f"RESULT ps_fuzz_unanswered={out['unanswered']}")
    print(f"RESULT ps_fuzz_good_failed={out['good_failed']}")
    print(f"shard stderr (tracebacks of any internal error): {SHARD_LOG}")
    print(f"RESULT ps_fuzz_rss_growth_mb={out['rss_end'] - out['rss_start']:.1f}")
    sys.exit(0 if out["alive"] and fuzz_applied == 0 and not out["good_failed"] else 1)


if __name__ == "__main__":
    main()

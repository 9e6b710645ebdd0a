"""Arrays a shard sends without copying, and the copy-on-write that keeps an update from changing one in flight.

Replies hand ZeroMQ the shard's own variable buffers (no copy, `ZERO_COPY_FROM` bytes and
up); ZeroMQ tracks when it has finished reading each. A reply holds its arrays from the
moment it is made (several replies can be made before any is sent: one release of held
pushes applies and answers several); an update that would change an array a reply holds,
or ZeroMQ is still reading, replaces it with a copy first. A view (a variable of a shard's
flat array) counts as the array that owns its memory: updating that array changes the view.
"""

from __future__ import annotations

import numpy as np

ZERO_COPY_FROM = 1 << 16  # bytes: smaller arrays are copied into the message, larger ones sent by reference


def _owner(array: np.ndarray) -> np.ndarray:
    return array if array.base is None else array.base


class SharedArrays:
    """What replies hold or ZeroMQ may still be reading: id(owner) -> [owner, trackers, replies holding it]."""

    def __init__(self):
        self.in_flight: dict[int, list] = {}

    def hold(self, arrays) -> None:
        """A reply was made with these arrays (it is not sent yet)."""
        for array in arrays:
            owner = _owner(array)
            self.in_flight.setdefault(id(owner), [owner, [], 0])[2] += 1

    def sent(self, arrays, trackers) -> None:
        """A reply went out: its `arrays`, and the trackers of those ZeroMQ sends by reference (else None)."""
        for array, tracker in zip(arrays, trackers):
            owner = _owner(array)
            entry = self.in_flight.get(id(owner))
            if entry is None:
                continue
            entry[2] -= 1
            if tracker is not None:
                entry[1].append(tracker)
            elif entry[2] <= 0 and not entry[1]:
                del self.in_flight[id(owner)]

    def writable(self, container: dict, key: str) -> np.ndarray:
        """`container[key]`, safe to update in place: copied first if a reply holds it or it is still sending."""
        array = container[key]
        entry = self.in_flight.pop(id(array), None)
        # Replies to different workers leave through different pipes: any of them may still be queued.
        if entry is not None and (entry[2] > 0 or not all(tracker.done for tracker in entry[1])):
            container[key] = array = array.copy()
        return array


def frames(arrays: dict | None, buffers) -> tuple[list, list]:
    """The wire buffers as ZeroMQ frames: small ones copied, large ones by reference and tracked.

    Returns (frames, trackers): a tracker per array (None where the buffer was copied)."""
    import zmq

    out, trackers = [], []
    for buffer in buffers:
        if len(buffer) < ZERO_COPY_FROM:
            out.append(bytes(buffer))
            trackers.append(None)
        else:  # each frame tracked on its own: one message's frames are released separately
            frame = zmq.Frame(buffer, copy=False, track=True)
            out.append(frame)
            trackers.append(frame.tracker)
    return out, trackers

"""The notebook's model by parts: each engine of a model-parallel run fetches the values of what it owns from the
kernel and hands its trained part back; no engine receives or sends the whole model.

The kernel's `PartsDesk` (a ROUTER socket) serves "part" requests from the notebook's models as the cell began
(`ModelState.part`: whole variables by position, or one engine's slice of each along an axis) and keeps each
engine's "trained" part. An engine asks through a `DeskClient`. Every message is a signed wire message
(`nbdist.ps.wire`): a JSON header and raw array buffers, sent without copying; nothing is unpickled. `pipeline`
stages own whole layers, `tensor` engines slices of layers; both use this one desk.
"""

from __future__ import annotations

import numpy as np

from ..keras_semantics.empty_weights import empty, fill, slots_without_values
from ..errors import ClusterError
from ..ps import wire
from ..ps.served_socket import ServedSocket

POLL_MS = 200
ANSWER_S = 120.0  # how long an engine waits for the desk's answer
WHOLE = 1 << 40  # a part may be large


class PartsDesk(ServedSocket):
    """Kernel side: serves each engine its part of the notebook's models (`models`: {name: `ModelState`}) and keeps
    the trained parts the engines hand in (`trained[(rank, fit)]`: weights, optimizer variables, header)."""

    thread_name = "nbdist-parts-desk"

    def __init__(self, key: bytes, models: dict | None = None):
        super().__init__()
        self.key, self.models = key, models or {}
        self.trained: dict[tuple[int, int], tuple[list, list, dict]] = {}
        self.trained_state: dict[tuple[int, int], dict[str, np.ndarray]] = {}  # other variables' parts, by address

    def start(self, bind: str) -> str:
        import zmq

        return self._serve_on(bind, zmq.ROUTER, self._serve, self.thread_name)

    def _serve(self) -> None:
        while not self._stopped.is_set():
            if not self._socket.poll(POLL_MS):
                continue
            ident, *frames = self._socket.recv_multipart()
            try:
                message = wire.decode(self.key, frames, max_bytes=WHOLE)
                if message.kind == "part":
                    self._socket.send_multipart([ident, *self._part(message.header)])
                elif message.kind == "trained":
                    self._keep_trained(message.header, message.arrays)
                    self._socket.send_multipart([ident, *wire.encode(self.key, "kept")])
                else:
                    self.other(ident, message.header)
            except (wire.Rejected, KeyError, ValueError):
                continue  # not from this run's engines: never acted on

    def other(self, ident: bytes, header: dict) -> None:
        """A message of another kind (a subclass's own, such as the pipeline's hellos)."""
        raise KeyError(header.get("kind"))

    def send(self, ident: bytes, frames: list) -> None:
        self._socket.send_multipart([ident, *frames])

    def _part(self, header: dict) -> list:
        state = self.models.get(header["model"])
        if state is None or state.architecture != header["architecture"]:  # one the cell made itself
            return wire.encode(self.key, "part", held=False)
        if state.kept is not None:  # its weights stayed on the engines: each stage has its part there
            return wire.encode(self.key, "part", held=False, kept=state.kept)
        weights, optimizer = state.part(header["weights"], header["trainable"], int(header["prefix"]),
                                        header.get("axes"), header.get("slot_axes"), int(header.get("rank", 0)),
                                        int(header.get("size", 1)))
        arrays = {f"w{i}": w for i, w in enumerate(weights)}
        arrays.update({f"o{i}": o for i, o in enumerate(optimizer or [])})
        return wire.encode(self.key, "part", arrays, held=True, optimizer=len(optimizer) if optimizer else None)

    def _keep_trained(self, header: dict, arrays: dict) -> None:
        weights = [arrays[f"w{i}"] for i in range(int(header["weights"]))]
        optimizer = [arrays[f"o{i}"] for i in range(int(header["optimizer"]))]
        self.trained[(int(header["rank"]), int(header["fit"]))] = (weights, optimizer, header)
        addresses = header.get("state") or []
        self.trained_state[(int(header["rank"]), int(header["fit"]))] = {
            address: arrays[f"s{i}"] for i, address in enumerate(addresses)}

class DeskClient:
    """Engine side: asks the kernel's desk, each answer awaited at most `timeout_s` (then fails naming `who`)."""

    def __init__(self, address: str, key: bytes, rank: int, who: str, context=None):
        import zmq

        self.address, self.key, self.rank, self.who = address, key, rank, who
        self._context = context or zmq.Context.instance()
        self.kept: dict | None = None  # the last part asked for stays on the engines (`kept_weights`): where

    def ask(self, frames: list, waiting_for: str, timeout_s: float = ANSWER_S) -> wire.Message:
        """Send `frames` (without copying them) and return the desk's signed answer."""
        import zmq

        desk = self._context.socket(zmq.DEALER)
        desk.setsockopt(zmq.LINGER, 0)
        desk.connect(self.address)
        try:
            desk.send_multipart(frames, copy=False)
            if not desk.poll(int(timeout_s * 1000)):
                raise ClusterError(f"{self.who}: {waiting_for} within {timeout_s:.0f} s.")
            return wire.decode(self.key, desk.recv_multipart(copy=False), max_bytes=WHOLE)
        finally:
            desk.close(linger=0)

    def fetch_part(self, model: str, architecture: str, weights: list[int], trainable: list[int], prefix: int,
                   **slicing) -> tuple[list | None, list | None]:
        """The notebook's values of model `model`'s weights at `weights` and of its optimizer's variables for the
        trainable variables at `trainable` (`ModelState.part`; `slicing`: axes, slot_axes, rank, size for one
        engine's slices); (None, None) where the notebook does not hold the model, the optimizer's None where it
        was not built."""
        reply = self.ask(wire.encode(self.key, "part", model=model, architecture=architecture, weights=weights,
                                     trainable=trainable, prefix=prefix, rank=self.rank, **slicing),
                         "the notebook did not send this engine's part of the model")
        self.kept = reply.header.get("kept")
        if not reply.header["held"]:
            return None, None
        count = reply.header["optimizer"]
        return ([reply.arrays[f"w{i}"] for i in range(len(weights))],
                [reply.arrays[f"o{i}"] for i in range(count)] if count else None)

    def send_part(self, fit: int, weights: list, optimizer: list, state: dict | None = None, **fields) -> None:
        """Send this engine's trained variables and optimizer variables of its `fit`-th fit to the kernel, and
        `state` ({address: array}: other variables' parts, the state walk's addresses), without copying them;
        returns once the kernel has them."""
        arrays = {f"w{i}": w for i, w in enumerate(weights)}
        arrays.update({f"o{i}": o for i, o in enumerate(optimizer)})
        arrays.update({f"s{i}": s for i, s in enumerate((state or {}).values())})
        self.ask(wire.encode(self.key, "trained", arrays, rank=self.rank, fit=fit, weights=len(weights),
                             optimizer=len(optimizer), state=list(state or {}), **fields),
                 "the notebook did not take this engine's trained part")


def taken(variable) -> np.ndarray:
    """The variable's value as an array over TensorFlow's own buffer (`numpy()` would copy it), the variable left
    empty: an engine's part is never held twice."""
    value = variable.value.read_value()._numpy()
    empty(variable)
    return value


def release(model, keep=()) -> None:
    """Free what this engine holds of `model` besides the variables `keep` (its weights, where an earlier run or the
    cell gave them values, and its optimizer's slots): under model parallelism an engine's copy is not the notebook's,
    and holding it whole is what the strategy avoids. The copy is marked released: the next run gives this
    engine the notebook's model again, and a second fit in the same cell is refused (`refuse_second_fit`)."""
    free_values(model, keep)
    model._nbdist_released = True
    _filled_on_load(model)


def _filled_on_load(model) -> None:
    """The cell's code after `fit` runs on this engine too, and may load a checkpoint into the released copy
    (keras-io's ViT: `model.load_weights(best)`, then `evaluate`): its emptied variables and optimizer slots are
    given values first, the whole model's, as the cell asks of every copy it runs on."""
    if "load_weights" in vars(model):
        return
    original = model.load_weights

    def load_weights(*args, **kwargs):
        optimizer = getattr(model, "optimizer", None)
        for variable in [*model.weights, *(optimizer.variables if getattr(optimizer, "built", False) else [])]:
            fill(variable)  # (a variable that holds a value keeps it)
        return original(*args, **kwargs)

    model.load_weights = load_weights


def free_values(model, keep=()) -> None:
    """Empty `model`'s weights besides `keep`, and its optimizer's slots (its iterations and learning rate stay)."""
    kept = {id(v) for v in keep}
    doomed = [v for v in model.weights if id(v) not in kept]
    if getattr(model.optimizer, "built", False):  # its slots (its iterations and learning rate are its settings)
        doomed += list(model.optimizer.variables)[optimizer_prefix(model.optimizer):]
    for variable in doomed:
        empty(variable)


def refuse_second_fit(model, strategy: str) -> None:
    from ..errors import OptionError

    if getattr(model, "_nbdist_released", False):
        raise OptionError(f"under --strategy {strategy} a training cell fits a model once: its engines gave their "
                          "copies back after the first fit, which the notebook has whole. Put the second fit in the "
                          "next cell.")


def notebook_name(model) -> str | None:
    """The name the engine's namespace (the notebook's replayed cells) holds `model` under, if any."""
    from ..host.namespace import user_namespace

    return next((k for k, v in user_namespace().items() if v is model and not k.startswith("_")), None)


def optimizer_prefix(optimizer) -> int:
    """How many of the optimizer's variables come before its per-variable slots (iteration, learning rate)."""
    return len(type(optimizer).from_config(optimizer.get_config()).variables)


def slots_per_variable(count: int, prefix: int, trainable: int) -> int:
    """Optimizer variables per trainable variable (Adam 2, SGD with momentum 1, plain SGD 0), of an optimizer of
    `count` variables over `trainable` variables: Keras keeps each trainable variable's slots together, in the
    order of the trainable variables, after its first `prefix` (iterations, learning rate)."""
    return (count - prefix) // trainable if trainable else 0


def slot_indices(prefix: int, per: int, index: int) -> range:
    """Where the slots of trainable variable number `index` sit among the optimizer's variables."""
    return range(prefix + index * per, prefix + (index + 1) * per)


def load_slots(optimizer, trainable_variables, slots: list | None) -> None:
    """Build `optimizer` over `trainable_variables` and give its variables `slots` (the notebook's, as
    `ModelState.part` cut them; another layout, a changed optimizer, starts fresh). Each slot is allocated as it
    takes its value, and `slots` lets go of each value it gave: never both held whole."""
    with slots_without_values():
        optimizer.build(trainable_variables)
    variables = optimizer.variables
    matches = slots is not None and len(slots) == len(variables)
    for i, variable in enumerate(variables):
        fill(variable, slots[i] if matches else None)
        if matches:
            slots[i] = None


def cut(array: np.ndarray, axis: int | None, rank: int, size: int) -> np.ndarray:
    """Rank `rank`'s slice of `array` along `axis` of `size` near-equal slices (None: the whole array)."""
    return array if axis is None else np.array_split(array, size, axis=axis)[rank]


def join(slices: list[np.ndarray], axis: int | None) -> np.ndarray:
    """The whole array from every rank's slice along `axis`, in rank order (None: rank 0's, the same on all)."""
    return slices[0] if axis is None else np.concatenate(slices, axis=axis)

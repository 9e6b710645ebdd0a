"""Every strategy in the registry through the contract, on one tiny cell: it trains (the History holds every
epoch, the notebook's model changed, the run recorded declared kinds of event only) or refuses the cell by
name before any engine trains. A strategy added to the registry is covered here without editing this test."""

from __future__ import annotations

import pytest

from nbdist.strategies import REGISTRY, strategy_names
from tests.support import idle_engines, strategy_line

pytestmark = pytest.mark.cluster

CELL = '''
model = build()
start = [w.copy() for w in model.get_weights()]
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x[:512], y[:512], batch_size=32, epochs=2, validation_data=(xt[:128], yt[:128]))
'''


@pytest.mark.parametrize("name", strategy_names())
def test_every_strategy_trains_the_cell_or_refuses_it_by_name(kernel, cluster, name):
    idle_engines(cluster, 2)
    reply = kernel.run(strategy_line(name) + CELL, timeout=300)
    if reply.status == "error":  # a refusal: nbdist's, naming the strategy, before any engine trained
        print(f"CONFORMANCE {name}: refused: {reply.evalue}")
        assert reply.ename == "OptionError" and name in reply.evalue, reply.error_text
        assert kernel.value("nbdist.last_run is None or nbdist.last_run.status != 'done'")
        return
    result = kernel.value("{'epochs': len(history.history['loss']), 'keys': sorted(history.history), "
                          "'changed': any(bool((a != b).any()) for a, b in zip(start, model.get_weights())), "
                          "'events': sorted({e['event'] for e in nbdist.last_run.events}), "
                          "'strategy': nbdist.last_run.strategy, 'status': nbdist.last_run.status}")
    declared = set(REGISTRY[name].event_sentences())
    print(f"CONFORMANCE {name}: trained: {result}")
    assert (result["strategy"], result["status"], result["epochs"]) == (name, "done", 2), result
    assert {"loss", "val_loss"} <= set(result["keys"]) and result["changed"], result
    assert all(e in declared or e.startswith("control:") for e in result["events"]), (result["events"], declared)

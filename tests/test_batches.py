"""Batches on demand (DESIGN.md section 11): the epoch's order, the dispatcher, shard 0's dealer, the synchronous
schedule, and Keras running epochs of a different length each. In-process: no cluster."""

from __future__ import annotations

import numpy as np
import pytest

from nbdist.datasets.batches import Dispatcher, SyncSchedule, epoch_order
from nbdist.ps import wire
from nbdist.ps.shard import Shard
from tests.support import SGD, W0, grads, message


def covered(ranges, n):
    """Each position of 0..n-1 and how often the (start, count) ranges cover it."""
    counts = np.zeros(n, int)
    for start, count in ranges:
        counts[start:start + count] += 1
    return counts


def test_an_epochs_order_is_a_permutation_fixed_by_seed_and_epoch():
    first, again, other = epoch_order(10, 7, 0), epoch_order(10, 7, 0), epoch_order(10, 7, 1)
    assert sorted(first) == list(range(10)) and list(first) == list(again) and list(first) != list(other)
    assert list(epoch_order(5, 7, 3, shuffle=False)) == [0, 1, 2, 3, 4]


def test_the_dispatcher_deals_every_sample_once_and_takes_a_dead_workers_batches_back():
    dispatcher = Dispatcher(10)
    dispatcher.open(0)
    assert dispatcher.deal(0, 4) == (0, 0, 4) and dispatcher.deal(1, 4) == (0, 4, 4)
    dispatcher.applied(0)
    assert dispatcher.deal(0, 4) == (0, 8, 2)  # the last batch takes what is left
    assert dispatcher.deal(0, 4) is None and not dispatcher.spent()
    assert dispatcher.lost(1) == 4  # worker 1 died holding [4, 8): dealt again, in pieces of the asker's size
    assert dispatcher.deal(0, 3) == (0, 4, 3) and dispatcher.deal(2, 3) == (0, 7, 1)
    for worker in (0, 0, 2):
        dispatcher.applied(worker)
    assert dispatcher.spent() and dispatcher.trained == {0: 9, 2: 1}
    applied = [(s, c) for _, w, s, c in dispatcher.log if w != 1]
    assert list(covered(applied, 10)) == [1] * 10


def test_the_sync_schedule_gives_each_rank_its_slice_and_re_splits_the_rest_after_a_death():
    ranks = [SyncSchedule(22, batch=2, seed=3) for _ in range(3)]  # every rank keeps its own copy
    for schedule in ranks:
        schedule.open(0)
    order = epoch_order(22, 3, 0)
    step0 = [s.step(rank, 3) for rank, s in enumerate(ranks)]
    assert [list(part) for part in step0] == [list(order[0:2]), list(order[2:4]), list(order[4:6])]
    for schedule in ranks:  # step 1 starts; rank 2 dies in its allreduce
        schedule.mark()
        schedule.step(0, 3)
    survivors = ranks[:2]
    for schedule in survivors:  # the survivors run the failed step again, now 2 of them
        schedule.rewind()
    trained = [*step0]
    while (parts := [s.step(rank, 2) for rank, s in enumerate(survivors)])[0] is not None:
        trained += parts
    assert sorted(np.concatenate(trained)) == list(range(22))  # every sample once that epoch
    assert [len(p) for p in trained[3:]] == [2, 2, 2, 2, 2, 2, 2, 2]  # 16 left, 4 a step over 2 ranks


def synchronous_steps(n, batch, size):
    ranks = [SyncSchedule(n, batch=batch, seed=1, shuffle=False) for _ in range(size)]
    for schedule in ranks:
        schedule.open(0)
    steps = []
    while (parts := [s.step(rank, size) for rank, s in enumerate(ranks)])[0] is not None:
        steps.append([[int(i) for i in p] for p in parts])
    assert ranks[0].steps_left(size) == 0
    return steps


def test_the_last_synchronous_step_splits_what_is_left_and_leaves_fewer_than_the_ranks_untrained():
    assert synchronous_steps(11, 4, 2) == [[[0, 1, 2, 3], [4, 5, 6, 7]], [[8, 9], [10]]]  # 3 left: 2 and 1
    assert synchronous_steps(9, 4, 2) == [[[0, 1, 2, 3], [4, 5, 6, 7]]]  # 1 left for 2 ranks: untrained


def dealing_shard(workers=2, **config) -> Shard:
    shard = Shard({"workers": workers, "data": {"mode": "dynamic", "seed": 5}, **config})
    shard.handle(b"w0", message("init", W0, worker=0, optimizer=SGD, trainable=list(W0), layout=list(W0)))
    return shard


def ask(shard, worker, epoch=0, size=4, n=10, depth=1, **fields):
    """The fields of the answers this batch request releases, by worker (`taken`: the batches it reports)."""
    replies = shard.handle(f"w{worker}".encode(), message("batch", worker=worker, epoch=epoch, size=size, n=n,
                                                          depth=depth, **fields))
    return {int(ident[1:]): fields for ident, kind, _, fields in replies if kind == "ok"}


def push(shard, worker, version=0, **fields):
    replies = shard.handle(f"w{worker}".encode(), message("push", grads(0.0), worker=worker, version=version, step=0,
                                                          **fields))
    return {int(ident[1:]): fields for ident, _, _, fields in replies}


def test_an_epoch_opens_when_every_worker_asked_and_each_answer_deals_the_next_batch():
    shard = dealing_shard()
    assert ask(shard, 1) == {}  # waits for worker 0
    assert ask(shard, 0) == {0: {"batches": [[0, 0, 4]]}, 1: {"batches": [[0, 4, 4]]}}  # rank order, every run
    assert push(shard, 0, taken=[0, 1])[0]["batches"] == [[0, 8, 2]]  # the push's answer brings its next batch
    assert "batches" not in push(shard, 0, taken=[0, 2])[0]  # nothing left to deal; worker 1 still holds [4, 8)
    assert ask(shard, 0, taken=[0, 2]) == {}  # so worker 0 waits: for a batch that comes back, or the epoch's end
    released = push(shard, 1, taken=[0, 1])  # the epoch's last batch applied: worker 0 hears the epoch is spent
    assert released[1].get("batches") is None and released[0] == {"batches": [], "spent": True}
    assert ask(shard, 1, taken=[0, 1]) == {1: {"batches": [], "spent": True}}
    assert shard.summary()["data"]["dealt"] == {"0": {"0": [2, 6], "1": [1, 4]}}


def test_a_push_of_local_steps_trains_the_batches_it_carried_and_a_new_allocation_resizes_the_next_deals():
    shard = dealing_shard()
    ask(shard, 1, size=2, n=20, depth=2)
    assert ask(shard, 0, size=3, n=20, depth=2) == {0: {"batches": [[0, 0, 3], [0, 3, 3]]},
                                                    1: {"batches": [[0, 6, 2], [0, 8, 2]]}}  # a commit's worth each
    assert push(shard, 0, taken=[0, 2])[0]["batches"] == [[0, 10, 3], [0, 13, 3]]  # both trained: two more
    assert list(shard.log)[-1][-1] == [0, 0, 3, 3, 3]  # the push log names both batches it trained
    shard.dealer.resize({0: (1, 1), 1: (4, 2)})  # ASHL re-allocated: worker 0 one batch of 1 at a time
    assert push(shard, 0, taken=[0, 4])[0]["batches"] == [[0, 16, 1]]
    assert push(shard, 1, taken=[0, 2])[1]["batches"] == [[0, 17, 3]]  # 4 asked, 3 left
    assert shard.summary()["data"]["dealt"] == {"0": {"0": [5, 13], "1": [3, 7]}}


def test_a_batch_counts_trained_once_however_often_the_models_optimizer_steps_in_it_even_never():
    """Pushes and batch requests say how many batches of the epoch the worker took; a batch is trained once,
    whether the model's optimizer stepped once in it, twice, or not at all (a GAN's train_step steps optimizers with
    tables of their own: its worker's request for more reports what it trained)."""
    shard = dealing_shard()
    ask(shard, 1, n=20)
    ask(shard, 0, n=20)  # worker 0 holds [0, 4), worker 1 [4, 8)
    assert push(shard, 0, taken=[0, 1])[0]["batches"] == [[0, 8, 4]]
    assert "batches" not in push(shard, 0, taken=[0, 1])[0]  # the same batch's second step: no batch trained
    assert [entry[-1] for entry in shard.log][-2:] == [[0, 0, 4], None]
    assert ask(shard, 1, n=20, taken=[0, 1]) == {1: {"batches": [[0, 12, 4]]}}  # its steps never pushed here
    assert ask(shard, 1, n=20, taken=[0, 1]) == {1: {"batches": []}}  # said again: [12, 16) is its, untrained
    assert ask(shard, 1, n=20, taken=[0, 2]) == {1: {"batches": [[0, 16, 4]]}}
    assert shard.summary()["data"]["dealt"] == {"0": {"0": [2, 8], "1": [3, 12]}}


def test_a_report_of_the_batches_taken_that_is_not_an_epoch_and_a_count_is_refused():
    shard = dealing_shard()
    ask(shard, 1)
    ask(shard, 0)
    for taken in ([0], [0, -1], "0,1", [0, True]):
        with pytest.raises(wire.Rejected, match="taken names an epoch"):
            push(shard, 0, taken=taken)
        with pytest.raises(wire.Rejected, match="taken names an epoch"):
            ask(shard, 0, taken=taken)


def test_no_table_waits_for_a_worker_that_waits_for_a_batch_or_at_an_epochs_end_on_table_0():
    """A synchronous round of the discriminator's table (1) does not wait for a worker that pushes nothing more until
    table 0 answers it: the message to table 0 that puts it there completes the round on table 1."""
    from nbdist.ps.tables import ShardTables

    tables = ShardTables({"workers": 2, "data": {"mode": "dynamic", "seed": 5}, "synchronous": True})
    for table in (0, 1):
        tables.handle(b"w0", message("init", W0, worker=0, optimizer=SGD, trainable=list(W0), layout=list(W0),
                                     table=table))

    def handle(worker, kind, arrays=None, **fields):
        replies = tables.handle(f"w{worker}".encode(), message(kind, arrays, worker=worker, **fields))
        return {(int(ident[1:]), kind) for ident, kind, _, _ in replies}

    handle(1, "batch", epoch=0, size=4, n=10, depth=1)
    handle(0, "batch", epoch=0, size=4, n=10, depth=1)  # worker 0 holds [0, 4), worker 1 [4, 8)
    assert handle(0, "push", grads(0.0), version=0, step=1, table=1) == set()  # the round waits for worker 1
    # worker 1 trained its batch with its own steps and asks for more: [8, 10) is dealt to it ...
    assert handle(1, "batch", epoch=0, size=4, n=10, depth=1, taken=[0, 1]) == {(1, "ok")}
    assert handle(1, "push", grads(0.0), version=0, step=1, table=1) == {(0, "weights"), (1, "weights")}
    assert handle(0, "push", grads(0.0), version=1, step=2, table=1) == set()
    # ... and having trained it, waits for a batch with none left: the round goes on without it
    assert handle(1, "batch", epoch=0, size=4, n=10, depth=1, taken=[0, 2]) == {(0, "weights")}
    assert tables.tables[1].version == 2
    handle(0, "batch", epoch=0, size=4, n=10, depth=1, taken=[0, 1])  # the epoch is spent: both hear it
    handle(1, "epoch", epoch=0, logs={"loss": 1.0})  # worker 1 waits at the epoch's end, worker 0 steps once more
    assert handle(0, "push", grads(0.0), version=2, step=3, table=1) == {(0, "weights")}


def test_a_dead_workers_batch_is_dealt_to_the_worker_waiting_for_one():
    shard = dealing_shard()
    ask(shard, 1)
    ask(shard, 0)
    push(shard, 0, taken=[0, 1])  # worker 0 trained [0, 4) and got [8, 10)
    push(shard, 0, taken=[0, 2])
    assert ask(shard, 0, taken=[0, 2]) == {}
    replies = shard.handle(b"k", message("drop", worker="controller", worker_id=1))
    answered = {ident: fields for ident, kind, _, fields in replies if ident == b"w0"}
    assert answered == {b"w0": {"batches": [[0, 4, 4]]}}  # worker 1's [4, 8), trained again by worker 0
    assert shard.events[-1]["event"] == "worker_dropped" and shard.events[-1]["requeued"] == 4


def test_a_waiting_worker_holds_back_no_round_and_no_staleness_bound():
    shard = dealing_shard(max_staleness=0)
    ask(shard, 1, size=2)
    ask(shard, 0, size=8)  # worker 0 holds [0, 8), worker 1 [8, 10)
    push(shard, 1, taken=[0, 1])  # lock-step: worker 1's answer waits for worker 0's push ...
    assert ask(shard, 1, size=2, taken=[0, 1]) == {}  # ... and worker 1, with nothing left, waits for a batch
    released = push(shard, 0, taken=[0, 1])  # so worker 0's push is not held for a worker that pushes nothing more
    assert set(released) == {0, 1} and shard.version == 2


def test_a_batch_request_that_names_other_data_is_refused():
    shard = dealing_shard()
    ask(shard, 0)
    with pytest.raises(wire.Rejected, match="every engine must hold the same data"):
        ask(shard, 1, n=11)


def test_an_evicted_worker_waiting_for_a_batch_ends_its_epoch():
    """Its batch request is answered with the stop (not the epoch's end): its pipeline must end on it too, or
    its step waits for a batch forever (a CI run hung there)."""
    from nbdist.datasets.dynamic_data import DealtBatches

    shard = dealing_shard()
    ask(shard, 1)
    ask(shard, 0)
    shard.handle(b"k", message("control", worker="controller", action="evict", value=1))
    [(_, kind, _, answer)] = shard.handle(b"w1", message("batch", worker=1, epoch=0, size=4, n=10, depth=1))
    assert kind == "weights" and answer.get("stop") is True and not answer.get("spent")

    class Client:  # the worker's side of the wire: this answer is what its request returns
        aborted = False

    batches = DealtBatches(Client(), n=10, seed=5, size=4)
    batches.spent = False
    batches._take(answer)
    assert list(batches.positions(0)) == []


def test_a_worker_holding_no_batch_asks_for_the_next_reporting_the_batches_it_took():
    """Whatever its steps push (a GAN's push nothing to the model's optimizer's table), its pipeline's reader asks
    for its next batch when it holds none, saying how many it took: the dealer counts them trained."""
    from types import SimpleNamespace

    from nbdist.datasets.batches import epoch_order
    from nbdist.datasets.dynamic_data import DealtBatches

    answers = [{"batches": [[0, 0, 4]]}, {"batches": [[0, 4, 4]]}, {"batches": [], "spent": True}]

    class Client:  # shard 0, as the worker's requests see it
        asked = []

        def request(self, kind, only=None, **fields):
            self.asked.append((kind, only, fields["taken"]))
            return [SimpleNamespace(header=answers[len(self.asked) - 1])]

    client = Client()
    batches = DealtBatches(client, n=8, seed=5, size=4)
    batches.open(0)
    taken = [list(indices) for indices in batches.positions(0)]
    assert client.asked == [("batch", 0, [0, 0]), ("batch", 0, [0, 1]), ("batch", 0, [0, 2])]
    order = epoch_order(8, 5, 0)
    assert taken == [list(order[:4]), list(order[4:])] and batches.report() == {"taken": [0, 2]}


def test_keras_runs_every_epoch_until_its_batches_end_whatever_their_number():
    import keras

    from nbdist.datasets.dynamic_data import epoch_follower, epochs_of_any_length, pipeline

    class Source:
        epoch, lengths, seen = 0, {0: 3, 1: 5, 2: 2}, []

        def positions(self, epoch):
            for i in range(self.lengths[epoch]):
                self.seen.append(epoch)
                yield np.arange(i * 2, i * 2 + 2)

    source = Source()
    x, y = np.random.default_rng(0).random((10, 3)), np.arange(10) % 2
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    counted = []

    class Count(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            counted.append(0)

        def on_train_batch_end(self, batch, logs=None):
            counted[-1] += 1

    with epochs_of_any_length():
        model.fit(pipeline((x, y, None), source), epochs=3, verbose=0, shuffle=False, callbacks=[epoch_follower(source), Count()])
    assert counted == [3, 5, 2] and source.seen == [0] * 3 + [1] * 5 + [2] * 2


def test_adam_on_a_pipeline_of_unknown_length_steps_and_counts_as_on_the_arrays():
    import keras

    from nbdist.datasets.dynamic_data import epoch_follower, epochs_of_any_length, pipeline

    class Source:
        epoch = 0

        def positions(self, epoch):
            for i in range(5):
                yield np.arange(i * 4, i * 4 + 4)

    x, y = np.random.default_rng(0).random((20, 3)).astype("float32"), np.random.default_rng(1).random((20, 1))

    def fitted(**data):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.1), "mse")
        with epochs_of_any_length():
            model.fit(epochs=3, verbose=0, shuffle=False, **data)
        return model

    source = Source()
    dealt = fitted(x=pipeline((x, y.astype("float32"), None), source), callbacks=[epoch_follower(source)])
    local = fitted(x=x, y=y.astype("float32"), batch_size=4)
    # the call that finds the epoch's batches spent counted an optimizer step (Adam's bias correction reads it)
    assert int(dealt.optimizer.iterations) == int(local.optimizer.iterations) == 15
    assert np.array_equal(dealt.get_weights()[0], local.get_weights()[0])


def test_the_pipeline_draws_each_batch_when_its_step_begins_not_ahead():
    import keras

    from nbdist.datasets.dynamic_data import epochs_of_any_length, pipeline

    events = []

    class Source:
        epoch = 0

        def positions(self, epoch):
            for i in range(4):
                events.append(("drawn", i))
                yield np.arange(i * 2, i * 2 + 2)

    class Begins(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            events.append(("begins", batch))

    x, y = np.random.default_rng(0).random((8, 3)).astype("float32"), np.arange(8) % 2
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with epochs_of_any_length():
        model.fit(pipeline((x, y, None), Source()), epochs=1, verbose=0, shuffle=False, callbacks=[Begins()])
    assert events == [e for i in range(4) for e in (("begins", i), ("drawn", i))] + [("begins", 4)]


def test_a_graceful_stop_tells_every_worker_waiting_for_a_batch_that_the_epoch_is_spent():
    shard = dealing_shard()
    ask(shard, 1)
    ask(shard, 0)  # worker 0 holds [0, 4), worker 1 [4, 8)
    push(shard, 0, taken=[0, 1])
    push(shard, 0, taken=[0, 2])  # worker 0 has nothing left; worker 1 still holds its batch
    assert ask(shard, 0, taken=[0, 2]) == {}
    replies = shard.handle(b"k", message("control", worker="controller", action="stop"))
    assert {ident: fields for ident, kind, _, fields in replies if ident == b"w0"} == {
        b"w0": {"batches": [], "spent": True, "stop": True}}


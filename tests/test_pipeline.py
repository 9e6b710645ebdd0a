"""`--strategy pipeline` on real engines: the same weights as one engine, the split it prints, what it refuses,
a dead stage and a stop."""

from __future__ import annotations

import os
import signal

import pytest

from tests.support import eventually, idle_engines, new_engine, own_cluster

pytestmark = pytest.mark.cluster
cluster = own_cluster(engines=4)  # a test kills a stage's engine

CELL = '''
model = build()
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
history = model.fit(x, y, batch_size=40, epochs=2, steps_per_epoch=10, shuffle=False, validation_data=(xt[:200], yt[:200]))
'''
DIFF = ("max(float(abs(a - b).max()) for a, b in zip({0}, {1}))")
METRICS = "[v.numpy() for v in model.metrics_variables]"  # the compiled loss tracker's and metrics' totals


@pytest.fixture(scope="module")
def local_run(kernel, cluster):
    idle_engines(cluster, 4)
    kernel.run("%%distribute --strategy local --seed 5\n" + CELL, timeout=180).check()
    kernel.run("local_w, local_opt = model.get_weights(), [v.numpy() for v in model.optimizer.variables]; "
               f"local_hist, local_metrics = history.history, {METRICS}").check()


@pytest.mark.parametrize("stages,micro,kind,replicas", [(2, 1, "1f1b", 1), (2, 4, "gpipe", 1), (3, 4, "1f1b", 1),
                                                      (2, 2, "1f1b", 2)])
def test_pipeline_equals_one_engine_after_20_steps(kernel, local_run, stages, micro, kind, replicas):
    kernel.run(f"%%distribute --strategy pipeline --stages {stages} --microbatches {micro} --schedule {kind} "
               f"--replicas {replicas} --seed 5\n" + CELL, timeout=240).check()
    assert kernel.value(DIFF.format("local_w", "model.get_weights()")) <= 1e-5
    # the optimizer's momentum slots came back from every stage, in the whole model's order
    assert kernel.value(DIFF.format("local_opt", "[v.numpy() for v in model.optimizer.variables]")) <= 1e-5
    # the compiled metrics came back from the last stage (its last validation's totals, as a local fit leaves them;
    # with replicas, replica 0's share)
    if replicas == 1:
        assert kernel.value(f"all(np.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(local_metrics, {METRICS}))")
    else:
        assert kernel.value(f"all(float(abs(m).sum()) > 0 for m in {METRICS})")
    result = kernel.value("{'hist': history.history, 'local': local_hist, 'plan': nbdist.last_run.plan}")
    assert result["hist"].keys() == result["local"].keys() and len(result["hist"]["loss"]) == 2
    for key, values in result["local"].items():
        assert result["hist"][key] == pytest.approx(values, abs=1e-5), key
    assert len(result["plan"]["stages"]) == stages and len(result["plan"]["cuts"]) == stages - 1
    layers = [name for stage in result["plan"]["stages"] for name in stage["layers"]]
    assert layers == kernel.value("[layer.name for layer in model.layers]")
    # the replicas of a stage applied the same summed gradients: the same bits
    same = kernel.value(f"(lambda r: all((a == b).all() for s in range({stages}) for k in range(1, {replicas}) for a, b "
                        f"in zip(r.results[r.workers[s]][0].weights, r.results[r.workers[s + k * {stages}]][0].weights)))"
                        "(nbdist.last_run)")
    assert same


def test_auto_split_balances_measured_layer_time_and_says_so(kernel, cluster):
    idle_engines(cluster, 2)
    # per sample: 256x1024, 1024x1024, 1024x1024, 1024x10 multiply-adds; two stages balance best cut after big_2
    cell = '''
import numpy as np
xb, yb = np.random.default_rng(0).random((256, 256), np.float32), np.arange(256) % 10
model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024, name="small_1"),
                          keras.layers.Dense(1024, name="big_2"), keras.layers.Dense(1024, name="big_3"),
                          keras.layers.Dense(10, name="out_4")])
model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(xb, yb, batch_size=128, epochs=1)
'''
    reply = kernel.run("%%distribute --strategy pipeline --stages 2\n" + cell, timeout=240)
    reply.check()
    plan = kernel.value("nbdist.last_run.plan")
    assert plan["basis"] == "time" and plan["cuts"] == ["big_2"]
    assert [s["layers"] for s in plan["stages"]] == [["small_1", "big_2"], ["big_3", "out_4"]]
    assert plan["stages"][0]["bytes"] == (256 * 1024 + 1024 + 1024 * 1024 + 1024) * 4
    assert "pipeline split (--split auto, balanced by measured time): cut after big_2" in reply.stdout


def local_then_pipeline(kernel, cell: str, options: str) -> None:
    """`cell` under local (its weights and History kept as ref_w and ref_hist), then under pipeline with
    `options` (its --seed the local run's too)."""
    seed = options.split("--seed ")[1].split()[0]
    kernel.run(f"%%distribute --strategy local --seed {seed}\n" + cell, timeout=180).check()
    kernel.run("ref_w, ref_hist = model.get_weights(), history.history").check()
    kernel.run(f"%%distribute --strategy pipeline {options}\n" + cell, timeout=240).check()


SKIP_CELL = '''
inputs = keras.Input((28, 28, 1))
flat = keras.layers.Flatten(name="flat")(inputs)
hidden = keras.layers.Dense(16, activation="relu", name="hidden")(flat)
joined = keras.layers.Concatenate(name="join")([flat, hidden])
model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax", name="head")(joined))
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="sparse_categorical_crossentropy")
history = model.fit(x, y, batch_size=40, epochs=1, steps_per_epoch=10, shuffle=False)
'''


def test_a_skip_connection_crosses_its_cut_with_the_activations_and_the_run_equals_one_engine(kernel, cluster):
    """The cut after 'hidden' is crossed by two tensors ('flat''s output, which the Concatenate takes, and
    'hidden''s): the first stage sends both per micro-batch, the second sends both gradients back."""
    idle_engines(cluster, 2)
    local_then_pipeline(kernel, SKIP_CELL, "--stages 2 --microbatches 2 --split hidden --seed 3")
    assert kernel.value(DIFF.format("ref_w", "model.get_weights()")) <= 1e-5


STREAM_CELL = '''
import tensorflow as tf
train = tf.data.Dataset.from_tensor_slices((x[:400], y[:400])).batch(40)
val = tf.data.Dataset.from_tensor_slices((xt[:200], yt[:200])).batch(50)
model = build()
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
history = model.fit(train, epochs=2, validation_data=val)
'''


def test_a_tf_data_pipeline_is_read_by_the_first_stage_and_the_run_equals_one_engine(kernel, cluster):
    """The first stage reads each batch of the cell's `tf.data` pipeline and hands its targets down; the 3 stages
    run the 10 steps its cardinality gives, and the run (weights, History with validation) equals one engine's."""
    idle_engines(cluster, 3)
    local_then_pipeline(kernel, STREAM_CELL, "--stages 3 --microbatches 2 --seed 5")
    assert kernel.value(DIFF.format("ref_w", "model.get_weights()")) <= 1e-5
    result = kernel.value("{'hist': history.history, 'local': ref_hist}")
    assert result["hist"].keys() == result["local"].keys() and len(result["hist"]["val_loss"]) == 2
    for key, values in result["local"].items():
        assert result["hist"][key] == pytest.approx(values, abs=1e-5), key
    endless = STREAM_CELL.replace(".batch(40)", ".batch(40).repeat()")
    reply = kernel.run("%%distribute --strategy pipeline --stages 2\n" + endless, timeout=180)
    assert reply.ename == "OptionError" and "pass steps_per_epoch=N to fit" in reply.evalue, reply.error_text


BERT = '''
import keras_hub
_rng = np.random.RandomState(0)
bert_x = {"token_ids": _rng.randint(1, 200, (640, 16)).astype("int32"),
          "segment_ids": np.zeros((640, 16), "int32"), "padding_mask": np.ones((640, 16), "int32")}
bert_y = _rng.randint(0, 2, 640)
def bert():  # KerasHub's backbone from its config (no preset download), without dropout, a head on its pooled output
    backbone = keras_hub.models.BertBackbone(vocabulary_size=200, num_layers=2, num_heads=4, hidden_dim=64,
                                             intermediate_dim=128, max_sequence_length=16, dropout=0.0)
    inputs = {name: keras.Input((16,), dtype="int32", name=name) for name in bert_x}
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax", name="head")(
        backbone(inputs)["pooled_output"]))
'''
BERT_CELL = '''
model = bert()  # (SGD: Adam's normalised step turns float rounding in a near-zero gradient into a whole step)
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="sparse_categorical_crossentropy")
history = model.fit(bert_x, bert_y, batch_size=32, epochs=1, steps_per_epoch=20, shuffle=False)
'''


@pytest.mark.parametrize("line", ["--strategy pipeline --stages 2", "--strategy tensor --workers 2"])
def test_a_kerashub_bert_classifier_equals_one_engine_after_20_steps(kernel, cluster, line):
    """KerasHub's BertBackbone nested in a classifier, fed a dict: `pipeline` cuts inside the backbone (the padding
    mask crossing the cut beside the activations), `tensor` splits its attention by heads and its feed-forward
    layers where they sit; weights and momentum slots equal one engine's after 20 steps."""
    idle_engines(cluster, 2)
    kernel.run(BERT, timeout=120).check()
    kernel.run("%%distribute --strategy local --seed 7\n" + BERT_CELL, timeout=180).check()
    kernel.run("bert_w, bert_opt = model.get_weights(), [v.numpy() for v in model.optimizer.variables]").check()
    kernel.run(f"%%distribute {line} --seed 7\n" + BERT_CELL, timeout=240).check()
    assert kernel.value(DIFF.format("bert_w", "model.get_weights()")) <= 1e-5
    assert kernel.value(DIFF.format("bert_opt", "[v.numpy() for v in model.optimizer.variables]")) <= 1e-5
    if "tensor" in line:
        kinds = kernel.value("{e['name'].split('/')[-1]: e['kind'] for e in nbdist.last_run.plan['layers']}")
        assert kinds["self_attention_layer"] == "heads" and kinds["feedforward_intermediate_dense"] == "column"
    else:
        cut = kernel.value("nbdist.last_run.plan['cuts']")
        assert cut and cut[0] not in ("head",), cut  # (a cut inside the backbone: the classifier has no other)


def test_a_killed_stage_engine_fails_the_run_by_name_and_the_cluster_serves_the_next_cell(kernel, cluster):
    first = idle_engines(cluster, 1)[0]
    victim, pid = new_engine(cluster)
    long = CELL.replace("epochs=2, steps_per_epoch=10", "epochs=500")
    msg_id = kernel.submit(f"%%distribute --strategy pipeline --targets {first},{victim} --progress text\n" + long)
    kernel.collect(msg_id, timeout=180, until_output="step")
    os.kill(pid, signal.SIGKILL)
    reply = kernel.collect(msg_id, timeout=120)
    assert reply.ename == "EngineDied", reply.error_text
    assert f"engine {victim} (host " in reply.evalue and "(pipeline stage 1) died" in reply.evalue
    other = next(e for e in idle_engines(cluster, 2) if e != first)
    kernel.run(f"%%distribute --strategy pipeline --targets {first},{other}\n" + CELL, timeout=180).check()
    assert kernel.value("len(history.history['loss'])") == 2


def test_stop_ends_every_stage_at_the_same_step_and_the_model_comes_back(kernel, cluster):
    idle_engines(cluster, 2)
    long = CELL.replace("epochs=2, steps_per_epoch=10", "epochs=500")
    kernel.run("%%distribute --strategy pipeline --workers 2 --background --progress none\n" + long,
               timeout=120).check()
    kernel.run("run = nbdist.last_run").check()
    eventually(kernel, "any((p.get('record') or {}).get('step', 0) > 5 for p in run.progress.values())", timeout=120)
    kernel.run("run.control('stop')").check()
    kernel.run("%dist wait", timeout=120).check()
    result = kernel.value("{'status': run.status, 'epochs': len(history.history['loss']), "
                          "'same': all((a == b).all() for a, b in zip(model.get_weights(), run.fits[0].weights))}")
    assert result["status"] == "done" and 0 < result["epochs"] < 500 and result["same"]


def test_a_model_the_notebook_trained_reaches_each_stage_as_its_part_and_continues_as_local(kernel, cluster):
    """The engines build the defined model with empty weights; each stage fetches its part of the notebook's
    weights and Adam slots (the notebook trained it before), and the run ends where `local`'s does."""
    idle_engines(cluster, 2)
    kernel.run("%%distribute define --name held\nheld = build()\n"
               "held.compile(optimizer=keras.optimizers.Adam(1e-3), loss='sparse_categorical_crossentropy')").check()
    kernel.run("held.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0)\n"
               "start = (held.get_weights(), [v.numpy() for v in held.optimizer.variables])").check()
    fit = "held.fit(x, y, batch_size=40, epochs=1, steps_per_epoch=5, shuffle=False)"
    kernel.run(f"%%distribute --strategy pipeline --stages 2 --seed 1\n{fit}", timeout=240).check()
    kernel.run("pipe = (held.get_weights(), [v.numpy() for v in held.optimizer.variables])\n"
               "held.set_weights(start[0])\n"
               "for v, a in zip(held.optimizer.variables, start[1]): v.assign(a)").check()
    kernel.run(f"%%distribute --strategy local --seed 1\n{fit}", timeout=240).check()
    assert kernel.value(DIFF.format("pipe[0]", "held.get_weights()")) <= 1e-5
    assert kernel.value(DIFF.format("pipe[1]", "[v.numpy() for v in held.optimizer.variables]")) <= 1e-5
    assert kernel.value("int(held.optimizer.iterations.numpy())") == 2 + 5


def test_a_weights_checkpoint_is_relayed_to_the_last_stage_and_read_back_whole_by_keras(kernel, cluster, tmp_path):
    """No engine holds the whole model: at the best epoch the stages relay their parts to the last, which writes
    the file the cell named; the notebook's own `load_weights(path)` reads the run's weights and Adam slots back."""
    idle_engines(cluster, 2)
    path = tmp_path / "best.weights.h5"
    cell = f'''
model = build()
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
best = keras.callbacks.ModelCheckpoint({str(path)!r}, monitor="loss", save_best_only=True, save_weights_only=True)
history = model.fit(x, y, batch_size=40, epochs=3, steps_per_epoch=10, shuffle=False, callbacks=[best])
'''
    reply = kernel.run("%%distribute --strategy pipeline --stages 2 --seed 2\n" + cell, timeout=240).check()
    assert f"ModelCheckpoint of the cell wrote {path} on host" in reply.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.weights.h5"]
    losses = kernel.value("history.history['loss']")
    assert losses.index(min(losses)) == 2 and kernel.value("best.best") == pytest.approx(min(losses))
    kernel.run("run_w, run_opt = model.get_weights(), [v.numpy() for v in model.optimizer.variables]\n"
               "back = build(); back.compile(optimizer=keras.optimizers.Adam(1e-3), "
               "loss='sparse_categorical_crossentropy'); back.optimizer.build(back.trainable_variables)\n"
               f"back.load_weights({str(path)!r})").check()
    assert kernel.value(DIFF.format("run_w", "back.get_weights()")) == 0
    assert kernel.value(DIFF.format("run_opt", "[v.numpy() for v in back.optimizer.variables]")) == 0


def test_a_checkpoint_that_monitors_a_compiled_metric_keeps_its_best_epoch_on_every_stage(kernel, cluster, tmp_path):
    """`ModelCheckpoint(monitor="val_accuracy")` with its default mode reads the metric's direction from the cell's
    compiled metrics: the first stage computes no metric of its own (keras-io's ViT failed there, raw), yet every
    stage saves at the epoch of the best validation accuracy: the file holds that epoch's weights."""
    idle_engines(cluster, 2)
    path = tmp_path / "best.weights.h5"
    cell = f'''
model = build()
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
best = keras.callbacks.ModelCheckpoint({str(path)!r}, monitor="val_accuracy", save_best_only=True,
                                       save_weights_only=True)
history = model.fit(x, y, batch_size=40, epochs=3, steps_per_epoch=5, shuffle=False, callbacks=[best],
                    validation_data=(xt[:200], yt[:200]))
'''
    kernel.run("%%distribute --strategy pipeline --stages 2 --seed 2\n" + cell, timeout=240).check()
    accuracy = kernel.value("history.history['val_accuracy']")
    assert kernel.value("best.best") == pytest.approx(max(accuracy))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.weights.h5"]
    kernel.run(f"model.load_weights({str(path)!r})").check()
    assert kernel.value("float(model.evaluate(xt[:200], yt[:200], verbose=0)[1])") == pytest.approx(max(accuracy))


CLOSURES = '''
def scaled_crossentropy(scale):
    def scaled(y_true, y_pred):
        return scale * keras.losses.sparse_categorical_crossentropy(y_true, y_pred)
    return scaled

def top_class_rate(y_true, y_pred):
    hits = keras.ops.cast(keras.ops.argmax(y_pred, -1), "int32") == keras.ops.cast(keras.ops.reshape(y_true, (-1,)), "int32")
    return keras.ops.mean(keras.ops.cast(hits, "float32"))
'''
OWN_LOSS_CELL = '''
model = build()
model.compile(optimizer=keras.optimizers.SGD(0.05), loss=scaled_crossentropy(0.5), metrics=[top_class_rate])
history = model.fit(x, y, batch_size=40, epochs=2, steps_per_epoch=10, shuffle=False)
'''


@pytest.mark.parametrize("line", ["--strategy pipeline --stages 2", "--strategy tensor --workers 2"])
def test_a_loss_closure_and_a_metric_of_the_notebook_train_unchanged(kernel, cluster, line):
    """A loss made by a closure of the notebook (keras.io's siamese `loss(margin)` is one) and a metric function of
    its own, defined in a plain cell: each engine's share compiles with them as they are (no registration), and the
    run equals one engine's after 20 steps."""
    idle_engines(cluster, 2)
    kernel.run(CLOSURES).check()
    kernel.run("%%distribute --strategy local --seed 3\n" + OWN_LOSS_CELL, timeout=180).check()
    kernel.run("own_local_w, own_local_hist = model.get_weights(), history.history").check()
    kernel.run(f"%%distribute {line} --seed 3\n" + OWN_LOSS_CELL, timeout=240).check()
    assert kernel.value(DIFF.format("own_local_w", "model.get_weights()")) <= 1e-5
    assert kernel.value("sorted(history.history)") == ["loss", "top_class_rate"]
    assert kernel.value("max(abs(a - b) for a, b in zip(own_local_hist['top_class_rate'], "
                        "history.history['top_class_rate']))") <= 1e-5


def test_a_whole_model_checkpoint_is_relayed_to_the_last_stage_and_keras_loads_it(kernel, cluster, tmp_path):
    """`ModelCheckpoint(path.keras)` (keras-io's timeseries example saves its best model so): the stages relay their
    parts, the last writes the whole model, and `keras.models.load_model` reads the best epoch's model, its Adam
    slots included; BackupAndRestore stays refused before training."""
    idle_engines(cluster, 3)
    path = tmp_path / "best.keras"
    cell = f'''
model = build()
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
best = keras.callbacks.ModelCheckpoint({str(path)!r}, monitor="loss", save_best_only=True)
history = model.fit(x, y, batch_size=40, epochs=3, steps_per_epoch=10, shuffle=False, callbacks=[best])
'''
    reply = kernel.run("%%distribute --strategy pipeline --stages 3 --seed 2\n" + cell, timeout=240).check()
    assert f"ModelCheckpoint of the cell wrote {path} on host" in reply.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.keras"]
    losses = kernel.value("history.history['loss']")
    assert losses.index(min(losses)) == 2  # (the best epoch is the last: the file holds the run's end)
    kernel.run("run_w, run_opt = model.get_weights(), [v.numpy() for v in model.optimizer.variables]\n"
               f"back = keras.models.load_model({str(path)!r})").check()
    assert kernel.value(DIFF.format("run_w", "back.get_weights()")) == 0
    assert kernel.value(DIFF.format("run_opt", "[v.numpy() for v in back.optimizer.variables]")) == 0
    reply = kernel.run("%%distribute --strategy pipeline --stages 2\nmodel = build()\n"
                       "model.compile(optimizer='sgd', loss='sparse_categorical_crossentropy')\n"
                       f"model.fit(x, y, epochs=1, steps_per_epoch=2, "
                       f"callbacks=[keras.callbacks.BackupAndRestore({str(tmp_path)!r})])", timeout=180)
    assert reply.ename == "OptionError" and "cannot run BackupAndRestore" in reply.evalue, reply.error_text


def test_weights_kept_on_the_engines_are_written_by_their_stages_and_trained_on_by_the_next_run(kernel, cluster,
                                                                                                tmp_path):
    """--keep-weights engines: no engine hands its part in; the notebook's model is the skeleton, whose save_weights
    has every stage write its own file; the next run trains on from the parts where they are, as a run whose
    weights came back to the notebook in between would."""
    targets = ",".join(map(str, idle_engines(cluster, 2)))
    kernel.run("%%distribute define --name kept_model\nkept_m = build()\n"
               "kept_m.compile(optimizer=keras.optimizers.Adam(1e-3), loss='sparse_categorical_crossentropy')").check()
    kernel.run("kept_m.optimizer.build(kept_m.trainable_variables)\n"
               "kept_start = (kept_m.get_weights(), [v.numpy() for v in kept_m.optimizer.variables])").check()
    fit = "kept_m.fit(x, y, batch_size=40, epochs=1, steps_per_epoch=5, shuffle=False)"
    pipeline = f"%%distribute --strategy pipeline --targets {targets} --seed 3"
    for _ in range(2):  # the reference: the weights back in the notebook after each run
        kernel.run(f"{pipeline}\n{fit}", timeout=240).check()
    kernel.run("kept_ref = (kept_m.get_weights(), [v.numpy() for v in kept_m.optimizer.variables])\n"
               "kept_m.set_weights(kept_start[0])\n"
               "for v, a in zip(kept_m.optimizer.variables, kept_start[1]): v.assign(a)").check()

    reply = kernel.run(f"{pipeline} --keep-weights engines\n{fit}", timeout=240).check()
    assert "stay on engines" in reply.stdout and kernel.value("list(kept_m._nbdist_kept['engines'])") == [
        int(t) for t in targets.split(",")]
    refused = kernel.run("kept_m.get_weights()")
    assert refused.ename == "OptionError" and "save_weights" in refused.evalue
    kernel.run(f"{pipeline} --keep-weights engines\n{fit}", timeout=240).check()  # on from the kept parts
    elsewhere = kernel.run(f"%%distribute --strategy hfdt --targets {targets}\n{fit}", timeout=240)
    assert elsewhere.ename == "OptionError" and "needs them in the notebook" in elsewhere.evalue
    saved = kernel.run(f"kept_m.save_weights({str(tmp_path / 'kept.weights.h5')!r})").check()
    assert "one file per stage" in saved.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.weights.json", "kept_00000.weights.h5",
                                                        "kept_00001.weights.h5"]
    kernel.run(f"kept_m.load_weights({str(tmp_path / 'kept.weights.json')!r})").check()  # the notebook's again
    assert kernel.value(DIFF.format("kept_ref[0]", "kept_m.get_weights()")) == 0
    assert kernel.value(DIFF.format("kept_ref[1]", "[v.numpy() for v in kept_m.optimizer.variables]")) == 0
    reply = kernel.run(f"%%distribute --strategy hfdt --targets {targets}\n{fit}", timeout=240)
    assert reply.status == "ok", reply.error_text  # held in the notebook again: any strategy takes it

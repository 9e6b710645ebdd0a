"""No silent stall under a parameter server (issue 65, item 6), on real engines through a real kernel: a cell whose
train_step steps two optimizers of its own at different rates (the model's own optimizer never) trains to the end
on numpy arrays, its batches dealt on demand; a run whose workers stop pushing fails within --stall-timeout, naming
each worker and what it waits for."""

from __future__ import annotations

import os
import re
import time

import numpy as np
import pytest

from tests.support import idle_engines, own_cluster, scaled

pytestmark = pytest.mark.cluster
cluster = own_cluster(engines=2)  # its stall test interrupts a worker held in the cell's own code

GAN = '''
import numpy as np, tensorflow as tf, keras
gan_x = np.random.default_rng(0).normal(size=(320, 8)).astype("float32")

class PenaltyGAN(keras.Model):
    """keras-io's WGAN-GP in small: each batch the critic steps `d_steps` times (each loss with a gradient penalty
    from a nested tape), then the generator once, each with an optimizer of its own."""
    def __init__(self, d_steps=3):
        super().__init__()
        self.critic = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                        keras.layers.Dense(1)])
        self.generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"),
                                           keras.layers.Dense(8)])
        self.d_steps = d_steps
    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer
    def penalty(self, real, fake):
        mixed = real + tf.random.uniform([tf.shape(real)[0], 1]) * (fake - real)
        with tf.GradientTape() as tape:
            tape.watch(mixed)
            score = self.critic(mixed, training=True)
        return tf.reduce_mean((tf.norm(tape.gradient(score, mixed), axis=1) - 1.0) ** 2)
    def train_step(self, real):
        real = real[0] if isinstance(real, tuple) else real
        for _ in range(self.d_steps):
            with tf.GradientTape() as tape:
                fake = self.generator(tf.random.normal([tf.shape(real)[0], 4]), training=True)
                d_loss = (tf.reduce_mean(self.critic(fake, training=True))
                          - tf.reduce_mean(self.critic(real, training=True)) + 10.0 * self.penalty(real, fake))
            grads = tape.gradient(d_loss, self.critic.trainable_variables)
            self.d_optimizer.apply_gradients(zip(grads, self.critic.trainable_variables))
        with tf.GradientTape() as tape:
            fake = self.generator(tf.random.normal([tf.shape(real)[0], 4]), training=True)
            g_loss = -tf.reduce_mean(self.critic(fake, training=True))
        grads = tape.gradient(g_loss, self.generator.trainable_variables)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_variables))
        return {"d_loss": d_loss, "g_loss": g_loss}
'''

GAN_FIT = '''
d_opt, g_opt = keras.optimizers.Adam(1e-3, beta_1=0.5), keras.optimizers.Adam(1e-3, beta_1=0.5)
gan = PenaltyGAN()
gan.compile(d_optimizer=d_opt, g_optimizer=g_opt)
history = gan.fit(gan_x, batch_size=32, epochs=2, verbose=0)
'''


@pytest.fixture(scope="module")
def gan(kernel):
    kernel.run("%%distribute define --name gan\n" + GAN, timeout=scaled(120)).check()
    return kernel


@pytest.mark.parametrize("strategy", ["nfdt", "asgd"])
def test_two_optimizers_stepped_three_to_one_in_a_train_step_train_to_the_end(gan, cluster, strategy):
    engines = idle_engines(cluster, 2)
    gan.run(f"%%distribute --strategy {strategy} --targets {','.join(map(str, engines))} --seed 3\n" + GAN_FIT,
            timeout=scaled(300)).check()
    batches = 2 * 320 // 32  # every sample once an epoch, over both workers
    assert gan.value("(int(d_opt.iterations), int(g_opt.iterations), int(gan.optimizer.iterations))") == [
        3 * batches, batches, 0]  # the shards counted every worker's steps; the model's own optimizer never stepped
    dealt = gan.value("[f.timings['batches'] for fits in nbdist.last_run.results.values() for f in fits]")
    for epoch in ("0", "1"):
        covered = np.zeros(320, int)
        for start, count in (part for worker in dealt for part in worker[epoch]):
            covered[start:start + count] += 1
        assert list(covered) == [1] * 320, (epoch, dealt)
    losses = gan.value("history.history")
    assert len(losses["d_loss"]) == len(losses["g_loss"]) == 2 and np.isfinite(losses["d_loss"]).all()


HELD = '''
import os, pathlib, threading, time
class HeldOnce(keras.callbacks.Callback):
    """The worker of engine process {pid} stops between two steps (before its third) and says when; it hangs
    until its engine is interrupted (at the latest 300 s on)."""
    def on_train_batch_begin(self, batch, logs=None):
        if os.getpid() == {pid} and batch == 2 and not pathlib.Path({mark!r}).exists():
            pathlib.Path({mark!r}).write_text(repr(time.time()))
            threading.Event().wait(300)
model = build()
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
history = model.fit(x, y, batch_size=64, epochs=2, callbacks=[HeldOnce()])
'''


def test_a_run_whose_workers_stop_pushing_fails_within_the_stall_bound_naming_each_worker(kernel, cluster, tmp_path):
    engines = idle_engines(cluster, 2)
    pid = cluster.client[engines[1]].apply_sync(os.getpid)
    mark, bound = tmp_path / "held", scaled(3)
    targets = ",".join(map(str, engines))
    reply = kernel.run(f"%%distribute --strategy nfdt --targets {targets} --stall-timeout {bound:g}\n"
                       + HELD.format(pid=pid, mark=str(mark)), timeout=scaled(300))
    failed_at = time.time()
    assert reply.ename == "RunStalled", reply.error_text
    # worker 0 trains the rest of the epoch, then waits for the batches worker 1 holds (or, had it taken them
    # all before worker 1 stopped, for worker 1's logs of the epoch)
    assert re.search(rf"worker 0 \(engine {engines[0]}, host [^)]*\), silent \d+ s: waiting for shard 0's answer to "
                     r"its (request for batches \(epoch 0, |logs of epoch 0)", reply.evalue), reply.evalue
    assert re.search(rf"worker 1 \(engine {engines[1]}, host [^)]*\), silent \d+ s: in the cell's own code \(a "
                     r"callback, the data pipeline, its train step\) since (step 2 of epoch 0 ended|its push of step "
                     r"2 to table 0 \(the model's optimizer, SGD)", reply.evalue), reply.evalue
    silent = [float(s) for s in re.findall(r"silent (\d+) s", reply.evalue)]
    assert len(silent) == 2 and all(bound - 1 <= s <= bound + scaled(10) for s in silent), reply.evalue
    assert failed_at - float(mark.read_text()) < bound + scaled(30)  # from the hold to the cell's error
    assert kernel.value("len(nbdist.last_run.weights) > 0")  # the parameter server's last checkpoint
    short = ("model = build()\nmodel.compile(optimizer='sgd', loss='sparse_categorical_crossentropy')\n"
             "model.fit(x, y, batch_size=64, epochs=1, steps_per_epoch=3)\n")
    kernel.run(f"%%distribute --strategy nfdt --targets {targets}\n" + short, timeout=scaled(180)).check()

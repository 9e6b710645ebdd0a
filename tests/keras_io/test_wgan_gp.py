"""keras-io "WGAN-GP overriding `Model.train_step`" as a notebook with no marks, in our own version: a subclassed
`WGAN` with its own `compile(d_optimizer, g_optimizer, d_loss_fn, g_loss_fn)` (two Adam optimizers kept as
attributes, besides the RMSprop `super().compile()` makes), three critic steps per generator step in its
`train_step`, each with a gradient penalty computed under a nested `tf.GradientTape` on images interpolated with
`tf.random.normal` weights, and a callback that saves generated images as PNG files beside the notebook.

After the run the notebook's `wgan` must be as a plain run leaves it (the state oracle): both optimizers built with
their Adam slots and their step counts (plain Keras: 144 critic and 48 generator steps), not unbuilt with 0.

Source of the program: https://github.com/keras-team/keras-io/blob/master/examples/generative/wgan_gp.py (A_K_Nain),
Apache License 2.0; written anew here at a small size: 1,024 Fashion-MNIST images from nbdist.datasets (offline),
a critic of two strided convolutions and a generator of three upsampling blocks, batch 64, 3 epochs.
"""

from __future__ import annotations

import sys

import pytest

from tests.keras_io.harness import STRATEGIES, Measure, Refused, Trains, history, run_example

SOURCE = "keras-team/keras-io examples/generative/wgan_gp.py"
LICENCE = "Apache-2.0"

SETUP = [
    '''
import numpy as np
import tensorflow as tf
import keras
from keras import layers
from nbdist.datasets import fashion_mnist
''',
    '''
IMG_SHAPE = (28, 28, 1)
BATCH_SIZE = 64
noise_dim = 32

(train_images, train_labels), _ = fashion_mnist(limit=1024)
train_images = train_images.reshape(-1, *IMG_SHAPE).astype("float32")
train_images = (train_images - 127.5) / 127.5  # in [-1, 1], as the generator's tanh
''',
    '''
def get_critic():
    image = layers.Input(shape=IMG_SHAPE)
    x = layers.ZeroPadding2D((2, 2))(image)  # 32 x 32: halves evenly
    x = layers.Conv2D(16, 5, strides=2, padding="same")(x)
    x = layers.LeakyReLU(0.2)(x)
    x = layers.Conv2D(32, 5, strides=2, padding="same")(x)
    x = layers.LeakyReLU(0.2)(x)
    x = layers.Dropout(0.3)(x)
    x = layers.Flatten()(x)
    x = layers.Dropout(0.2)(x)
    return keras.Model(image, layers.Dense(1)(x), name="discriminator")


def get_generator():
    noise = layers.Input(shape=(noise_dim,))
    x = layers.Dense(4 * 4 * 32, use_bias=False)(noise)
    x = layers.BatchNormalization()(x)
    x = layers.LeakyReLU(0.2)(x)
    x = layers.Reshape((4, 4, 32))(x)
    for filters in (16, 8):
        x = layers.UpSampling2D()(x)
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        x = layers.LeakyReLU(0.2)(x)
    x = layers.UpSampling2D()(x)
    x = layers.Conv2D(1, 3, padding="same", use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("tanh")(x)
    return keras.Model(noise, layers.Cropping2D((2, 2))(x), name="generator")  # back to 28 x 28
''',
    '''
class WGAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim, discriminator_extra_steps=3, gp_weight=10.0):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.d_steps = discriminator_extra_steps
        self.gp_weight = gp_weight

    def compile(self, d_optimizer, g_optimizer, d_loss_fn, g_loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.d_loss_fn = d_loss_fn
        self.g_loss_fn = g_loss_fn

    def gradient_penalty(self, batch_size, real_images, fake_images):
        # the critic's gradient on images between real and fake ones, pushed towards norm 1
        alpha = tf.random.normal([batch_size, 1, 1, 1], 0.0, 1.0)
        interpolated = real_images + alpha * (fake_images - real_images)
        with tf.GradientTape() as gp_tape:
            gp_tape.watch(interpolated)
            pred = self.discriminator(interpolated, training=True)
        grads = gp_tape.gradient(pred, [interpolated])[0]
        norm = tf.sqrt(tf.reduce_sum(tf.square(grads), axis=[1, 2, 3]))
        return tf.reduce_mean((norm - 1.0) ** 2)

    def train_step(self, real_images):
        if isinstance(real_images, tuple):
            real_images = real_images[0]
        batch_size = tf.shape(real_images)[0]
        for _ in range(self.d_steps):
            random_latent_vectors = tf.random.normal(shape=(batch_size, self.latent_dim))
            with tf.GradientTape() as tape:
                fake_images = self.generator(random_latent_vectors, training=True)
                fake_logits = self.discriminator(fake_images, training=True)
                real_logits = self.discriminator(real_images, training=True)
                d_cost = self.d_loss_fn(real_img=real_logits, fake_img=fake_logits)
                gp = self.gradient_penalty(batch_size, real_images, fake_images)
                d_loss = d_cost + gp * self.gp_weight
            d_gradient = tape.gradient(d_loss, self.discriminator.trainable_variables)
            self.d_optimizer.apply_gradients(zip(d_gradient, self.discriminator.trainable_variables))

        random_latent_vectors = tf.random.normal(shape=(batch_size, self.latent_dim))
        with tf.GradientTape() as tape:
            generated_images = self.generator(random_latent_vectors, training=True)
            gen_img_logits = self.discriminator(generated_images, training=True)
            g_loss = self.g_loss_fn(gen_img_logits)
        gen_gradient = tape.gradient(g_loss, self.generator.trainable_variables)
        self.g_optimizer.apply_gradients(zip(gen_gradient, self.generator.trainable_variables))
        return {"d_loss": d_loss, "g_loss": g_loss}
''',
    '''
class GANMonitor(keras.callbacks.Callback):
    def __init__(self, num_img=3, latent_dim=32):
        self.num_img = num_img
        self.latent_dim = latent_dim

    def on_epoch_end(self, epoch, logs=None):
        random_latent_vectors = tf.random.normal(shape=(self.num_img, self.latent_dim))
        generated_images = self.model.generator(random_latent_vectors)
        generated_images = (generated_images * 127.5) + 127.5
        for i in range(self.num_img):
            img = keras.utils.array_to_img(generated_images[i].numpy())
            img.save("generated_img_{i}_{epoch}.png".format(i=i, epoch=epoch))
''',
    '''
def discriminator_loss(real_img, fake_img):
    return tf.reduce_mean(fake_img) - tf.reduce_mean(real_img)


def generator_loss(fake_img):
    return -tf.reduce_mean(fake_img)
''',
]

RUN = [
    '''
d_model = get_critic()
g_model = get_generator()
generator_optimizer = keras.optimizers.Adam(learning_rate=0.0002, beta_1=0.5, beta_2=0.9)
discriminator_optimizer = keras.optimizers.Adam(learning_rate=0.0002, beta_1=0.5, beta_2=0.9)
''',
    '''%%distribute {line}
epochs = 3
cbk = GANMonitor(num_img=3, latent_dim=noise_dim)
wgan = WGAN(discriminator=d_model, generator=g_model, latent_dim=noise_dim, discriminator_extra_steps=3)
wgan.compile(
    d_optimizer=discriminator_optimizer,
    g_optimizer=generator_optimizer,
    g_loss_fn=generator_loss,
    d_loss_fn=discriminator_loss,
)
wgan.fit(train_images, batch_size=BATCH_SIZE, epochs=epochs, callbacks=[cbk])
''',
]

STRATEGIES_HERE = (*STRATEGIES, "asgd")
OUTCOMES = {
    "local": Trains(),
    "hfdt": Trains(),  # both optimizers' gradients averaged across ranks at each of their steps
    "nfdt": Trains(),  # each optimizer a table of its own on the shards, stepped at its own rate
    "asgd": Trains(),
    "pipeline": Refused("also applies d_optimizer, g_optimizer (optimizers of its own)"),
    "tensor": Trains(),  # the split critic's and generator's slices, stepped as one model would be
}
MODEL = "wgan"
MEASURE = Measure("the last epoch's critic loss", "float(wgan.history.history['d_loss'][-1])", higher=None)
FILES = ["generated_img_*.png"]


def check(notebook, strategy):
    """The example trains both networks through `fit` (its History: d_loss, g_loss, one per epoch) and its callback
    writes generated_img_<i>_<epoch>.png, three an epoch, beside the notebook: the last epoch's load, 28x28. Both
    optimizers came back built and stepped (the state oracle holds their counts to the strategy's rule)."""
    d_loss, g_loss = history(notebook, "d_loss"), history(notebook, "g_loss")
    assert len(d_loss) == len(g_loss) == 3, (d_loss, g_loss)
    sizes = notebook.value("[keras.utils.load_img('generated_img_%d_2.png' % i).size for i in range(3)]")
    assert sizes == [[28, 28]] * 3
    built = notebook.value("[wgan.d_optimizer.built, wgan.g_optimizer.built, "
                           "int(wgan.d_optimizer.iterations) == 3 * int(wgan.g_optimizer.iterations) > 0]")
    assert built == [True, True, True], built


@pytest.mark.parametrize("strategy", STRATEGIES_HERE)
def test_example(notebook, plain_notebook, cluster, strategy):
    run_example(notebook, sys.modules[__name__], strategy, cluster, plain_notebook)

"""keras-io "Image classification with Vision Transformer" as a notebook with no marks: a functional model whose
input goes through a Sequential of preprocessing adapted in the notebook (`Normalization`) and of random
augmentation (`RandomFlip`, `RandomRotation`, `RandomZoom`), then two custom layers (`Patches`, `PatchEncoder`:
a Dense and an Embedding inside a layer of the notebook), Transformer blocks (`MultiHeadAttention` with dropout,
Dense MLPs with dropout), trained with AdamW and a `ModelCheckpoint(monitor="val_accuracy", save_best_only=True,
save_weights_only=True)` whose best epoch the cell loads back before it evaluates.

Source: https://github.com/keras-team/keras-io/blob/master/examples/vision/image_classification_with_vision_transformer.py
(Khalid Salama), Apache License 2.0. Adapted: Fashion-MNIST from nbdist.datasets padded to 32x32 and repeated to
three channels instead of CIFAR-100 (offline), 2,048 training and 512 test images, 10 classes; image_size 32
(the Resizing kept), patch_size 8, projection_dim 16, 2 heads, 2 Transformer layers, MLP head [64, 32] instead of
72, 6, 64, 4, 8 and [2048, 1024]; batch 32, 4 epochs (plain Keras over seeds 1-3: 0.49-0.54 test accuracy; batch 64 and 3 epochs
gave 0.37-0.52, too wide a spread to hold a strategy to); the checkpoint beside the notebook instead of /tmp; the
patch-plotting cell left out.

Besides the example under every strategy, the faults keras-io's ViT showed under `tensor` (0.19-0.28 test
accuracy where `local` reached 0.59-0.65) are held here: with its random layers removed `tensor` equals `local`
to 1e-5 after 20 steps; as pasted, the engines compute equal replicated activations in training mode, and the
test accuracy is within the spread of plain Keras over seeds (measured).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tests.keras_io.harness import (CELL_TIMEOUT_S, RESEED, STRATEGIES, Bound, Measure, distributed, history,
                                    run_example, trains_everywhere)
from tests.support import idle_engines

SOURCE = "keras-team/keras-io examples/vision/image_classification_with_vision_transformer.py"
LICENCE = "Apache-2.0"

SETUP = [
    '''
import keras
from keras import layers
from keras import ops

import numpy as np
from nbdist.datasets import fashion_mnist
''',
    # adapted: Fashion-MNIST as 32x32 RGB images instead of keras.datasets.cifar100 (offline)
    '''
num_classes = 10
input_shape = (32, 32, 3)

(x_train, y_train), (x_test, y_test) = fashion_mnist(limit=2048)
x_test, y_test = x_test[:512], y_test[:512]
x_train, x_test = (np.repeat(np.pad(x, ((0, 0), (2, 2), (2, 2)))[..., None], 3, axis=-1) for x in (x_train, x_test))
y_train, y_test = y_train[:, None].astype("int64"), y_test[:, None].astype("int64")

print(f"x_train shape: {x_train.shape} - y_train shape: {y_train.shape}")
print(f"x_test shape: {x_test.shape} - y_test shape: {y_test.shape}")
''',
    '''
learning_rate = 0.001
weight_decay = 0.0001
batch_size = 32
num_epochs = 4
image_size = 32  # We'll resize input images to this size
patch_size = 8  # Size of the patches to be extract from the input images
num_patches = (image_size // patch_size) ** 2
projection_dim = 16
num_heads = 2
hidden_dim = projection_dim * num_heads
transformer_units = [
    hidden_dim * 2,
    hidden_dim,
]  # Size of the transformer layers
transformer_layers = 2
mlp_head_units = [
    64,
    32,
]  # Size of the dense layers of the final classifier
''',
    '''
data_augmentation = keras.Sequential(
    [
        layers.Normalization(),
        layers.Resizing(image_size, image_size),
        layers.RandomFlip("horizontal"),
        layers.RandomRotation(factor=0.02),
        layers.RandomZoom(height_factor=0.2, width_factor=0.2),
    ],
    name="data_augmentation",
)
# Compute the mean and the variance of the training data for normalization.
data_augmentation.layers[0].adapt(x_train)
''',
    '''
def mlp(x, hidden_units, dropout_rate):
    for units in hidden_units:
        x = layers.Dense(units, activation=keras.activations.gelu)(x)
        x = layers.Dropout(dropout_rate)(x)
    return x
''',
    '''
class Patches(layers.Layer):
    def __init__(self, patch_size):
        super().__init__()
        self.patch_size = patch_size

    def call(self, images):
        input_shape = ops.shape(images)
        batch_size = input_shape[0]
        height = input_shape[1]
        width = input_shape[2]
        channels = input_shape[3]
        num_patches_h = height // self.patch_size
        num_patches_w = width // self.patch_size
        patches = keras.ops.image.extract_patches(images, size=self.patch_size)
        patches = ops.reshape(
            patches,
            (
                batch_size,
                num_patches_h * num_patches_w,
                self.patch_size * self.patch_size * channels,
            ),
        )
        return patches

    def get_config(self):
        config = super().get_config()
        config.update({"patch_size": self.patch_size})
        return config
''',
    '''
class PatchEncoder(layers.Layer):
    def __init__(self, num_patches, projection_dim):
        super().__init__()
        self.num_patches = num_patches
        self.projection = layers.Dense(units=projection_dim)
        self.position_embedding = layers.Embedding(
            input_dim=num_patches, output_dim=projection_dim
        )

    def call(self, patch):
        positions = ops.expand_dims(
            ops.arange(start=0, stop=self.num_patches, step=1), axis=0
        )
        projected_patches = self.projection(patch)
        encoded = projected_patches + self.position_embedding(positions)
        return encoded

    def get_config(self):
        config = super().get_config()
        config.update({"num_patches": self.num_patches})
        return config
''',
    '''
def create_vit_classifier():
    inputs = keras.Input(shape=input_shape)
    # Augment data.
    augmented = data_augmentation(inputs)
    # Create patches.
    patches = Patches(patch_size)(augmented)
    # Encode patches.
    encoded_patches = PatchEncoder(num_patches, hidden_dim)(patches)

    # Create multiple layers of the Transformer block.
    for _ in range(transformer_layers):
        # Layer normalization 1.
        x1 = layers.LayerNormalization(epsilon=1e-6)(encoded_patches)
        # Create a multi-head attention layer.
        attention_output = layers.MultiHeadAttention(
            num_heads=num_heads, key_dim=projection_dim, dropout=0.1
        )(x1, x1)
        # Skip connection 1.
        x2 = layers.Add()([attention_output, encoded_patches])
        # Layer normalization 2.
        x3 = layers.LayerNormalization(epsilon=1e-6)(x2)
        # MLP.
        x3 = mlp(x3, hidden_units=transformer_units, dropout_rate=0.1)
        # Skip connection 2.
        encoded_patches = layers.Add()([x3, x2])

    # Create a [batch_size, projection_dim] tensor.
    representation = layers.LayerNormalization(epsilon=1e-6)(encoded_patches)
    representation = layers.Flatten()(representation)
    representation = layers.Dropout(0.5)(representation)
    # Add MLP.
    features = mlp(representation, hidden_units=mlp_head_units, dropout_rate=0.5)
    # Classify outputs.
    logits = layers.Dense(num_classes)(features)
    # Create the Keras model.
    model = keras.Model(inputs=inputs, outputs=logits)
    return model
''',
    '''
def run_experiment(model):
    optimizer = keras.optimizers.AdamW(
        learning_rate=learning_rate, weight_decay=weight_decay
    )

    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[
            keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
            keras.metrics.SparseTopKCategoricalAccuracy(5, name="top-5-accuracy"),
        ],
    )

    checkpoint_filepath = "checkpoint.weights.h5"
    checkpoint_callback = keras.callbacks.ModelCheckpoint(
        checkpoint_filepath,
        monitor="val_accuracy",
        save_best_only=True,
        save_weights_only=True,
    )

    history = model.fit(
        x=x_train,
        y=y_train,
        batch_size=batch_size,
        epochs=num_epochs,
        validation_split=0.1,
        callbacks=[checkpoint_callback],
    )

    model.load_weights(checkpoint_filepath)
    _, accuracy, top_5_accuracy = model.evaluate(x_test, y_test)
    print(f"Test accuracy: {round(accuracy * 100, 2)}%")
    print(f"Test top 5 accuracy: {round(top_5_accuracy * 100, 2)}%")

    return history
''',
]

RUN = [
    '''%%distribute {line}
vit_classifier = create_vit_classifier()
history = run_experiment(vit_classifier)
''',
]

OUTCOMES = trains_everywhere()
MODEL = "vit_classifier"
FILES = ["checkpoint.weights.h5"]  # removed before each strategy's run: its check reads this run's best epoch
# the cell ends with `model.load_weights(checkpoint_filepath)`, the best epoch's file, and a Keras 3 weights file holds
# the optimizer's variables too: its step count is the best epoch's, and which epoch is best varies by run (plain's
# 4th of 4 with seed 1, 232 steps; hfdt's 3rd, 87 = 3 x 29 on each of 2 ranks)
IGNORE = ["vit_classifier.optimizer/_iterations"]
# the cell's run_experiment evaluates the best epoch's model but keeps only the History: evaluated again here
MEASURE = Measure("test accuracy (the best epoch's)", "float(vit_classifier.evaluate(x_test, y_test, verbose=0)[1])")
# measured (build/bounds/test_image_classification_with_vision_transformer.json):
#   .venv/bin/python -m tests.keras_io.measure test_image_classification_with_vision_transformer hfdt nfdt pipeline tensor --seeds 5
# value = the mean less 3 sd of the strategy's five runs, seeds 1-5
# a finding (reported): nfdt's mean is 0.055 below plain's, more than either spread (sd 0.022; plain 0.030); its
# bound is its own runs' spread
BOUNDS = {
    "hfdt": Bound(0.3472, "seeds 1-5: 0.482, 0.443, 0.539, 0.592, 0.535; mean 0.518 sd 0.057; "
                          "plain 0.532 sd 0.030 (gap -0.014); 2026-12-07"),
    "nfdt": Bound(0.4100, "seeds 1-5: 0.439, 0.492, 0.475, 0.482, 0.494; mean 0.477 sd 0.022; "
                          "plain 0.532 sd 0.030 (gap -0.055); 2026-12-07"),
    "pipeline": Bound(0.3616, "seeds 1-5: 0.564, 0.479, 0.488, 0.582, 0.473; mean 0.517 sd 0.052; "
                              "plain 0.532 sd 0.030 (gap -0.015); 2026-12-07"),
    "tensor": Bound(0.4680, "seeds 1-5: 0.537, 0.518, 0.494, 0.531, 0.539; mean 0.524 sd 0.019; "
                            "plain 0.532 sd 0.030 (gap -0.008); 2026-12-07"),
}


def check(notebook, strategy):
    """The example: about 55% test accuracy on CIFAR-100 after 100 epochs (here: MEASURE). Here: the best epoch by
    validation accuracy is the one the checkpoint wrote and the cell loaded (its model classifies the validation
    images to that accuracy)."""
    accuracy = history(notebook, "val_accuracy")
    assert len(accuracy) == 4, accuracy
    # (validation_split=0.1: the last tenth) by `predict`, not `evaluate`: the state oracle compares the compiled
    # metrics' totals after this check with a plain run's, whose last evaluation is the cell's (the test images)
    first = "int(len(x_train) * 0.9)"
    best = notebook.value(f"float(np.mean(np.argmax(vit_classifier.predict(x_train[{first}:], verbose=0), -1) == "
                          f"y_train[{first}:, 0]))")
    # Two numbers of the same run that must agree: the loaded model's accuracy on the validation images and the
    # History's best. Under local, pipeline and tensor the same model on the same images (1e-6: float rounding).
    # hfdt validates on equal shards of the 205 images: 204 of them, one image's worth. nfdt's val_accuracy joins
    # both asynchronous workers' validations, each of its shard on its own copy, while the checkpoint is rank 0's:
    # they differed by 0.002 and 0.007 in two runs; four images' worth is allowed.
    tolerance = {"hfdt": 0.006, "nfdt": 0.02}.get(strategy, 1e-6)
    assert best == pytest.approx(max(accuracy), abs=tolerance), (best, accuracy)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_example(notebook, plain_notebook, cluster, strategy):
    run_example(notebook, sys.modules[__name__], strategy, cluster, plain_notebook)


# -- the faults keras-io's ViT showed under tensor ------------------------------------------------------------------

def without_random_layers() -> str:
    """The example's model-building cells with its augmentation reduced to the adapted Normalization (and the
    Resizing) and every dropout rate 0, as a notebook cell; the model built from a fixed seed, its values kept."""
    builder = next(cell for cell in SETUP if "def create_vit_classifier" in cell)
    for random, none in (("dropout=0.1", "dropout=0.0"), ("dropout_rate=0.1", "dropout_rate=0.0"),
                         ("Dropout(0.5)", "Dropout(0.0)"), ("dropout_rate=0.5", "dropout_rate=0.0")):
        assert random in builder
        builder = builder.replace(random, none)
    return builder + '''
data_augmentation = keras.Sequential([data_augmentation.layers[0], layers.Resizing(image_size, image_size)],
                                     name="data_augmentation")
keras.utils.set_random_seed(7)
vit_classifier = create_vit_classifier()
start = vit_classifier.get_weights()
'''


TWENTY_STEPS = '''%%distribute {line}
vit_classifier.compile(
    optimizer=keras.optimizers.AdamW(learning_rate=learning_rate, weight_decay=weight_decay),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
)
vit_classifier.fit(x_train, y_train, batch_size=batch_size, epochs=1, steps_per_epoch=20, shuffle=False)
'''
DIFF = "max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip({}, {}))"


def test_without_its_random_layers_tensor_equals_local_after_20_steps(notebook, cluster):
    """Augmentation reduced to the adapted `Normalization` (and the `Resizing`), every dropout rate 0: two engines
    holding half of each split layer (the PatchEncoder's Dense inside a notebook layer, the attention by heads,
    the head's Dense) end 20 AdamW steps where one engine does, weights and optimizer slots to 1e-5 (but the
    attention's key bias, whose gradient is zero: below)."""
    idle_engines(cluster, 2)
    notebook.run("saved_augmentation, saved_builder = data_augmentation, create_vit_classifier").check()
    notebook.run(without_random_layers()).check()
    try:
        notebook.run(distributed(TWENTY_STEPS, "local"), timeout=240).check()
        notebook.run("local_w = vit_classifier.get_weights()\n"
                     "local_opt = [v.numpy() for v in vit_classifier.optimizer.variables]\n"
                     "vit_classifier = create_vit_classifier(); vit_classifier.set_weights(start)").check()
        reply = notebook.run(distributed(TWENTY_STEPS, "tensor"), timeout=240).check()
        assert "multi_head_attention" in reply.stdout and "heads" in reply.stdout, reply.stdout[-3000:]
        paths = notebook.value("[w.path for w in vit_classifier.weights]")
        free = [i for i, path in enumerate(paths) if path.endswith("key/bias")]
        assert len(free) == 2  # (one per Transformer block)
        kept = [i for i in range(len(paths)) if i not in free]
        assert notebook.value(DIFF.format(f"[local_w[i] for i in {kept}]",
                                          f"[vit_classifier.get_weights()[i] for i in {kept}]")) <= 1e-5
        assert notebook.value(DIFF.format("local_opt", "[v.numpy() for v in vit_classifier.optimizer.variables]")) <= 1e-5
        # The key projection's bias adds q.b to every score of a query: softmax cancels it, its gradient is 0 in
        # exact arithmetic, and Adam's step divides its rounding noise (1e-10) by its own size. Both runs move it
        # by that noise alone (2e-5 here); it stays below 1e-4 in each.
        for run in ("local_w", "vit_classifier.get_weights()"):
            assert notebook.value(f"max(float(np.max(np.abs({run}[i]))) for i in {free})") <= 1e-4
    finally:
        notebook.run("data_augmentation, create_vit_classifier = saved_augmentation, saved_builder").check()


PROBE = '''
import os


class ReplicatedActivations(keras.callbacks.Callback):
    """After the first training step, the activations every engine must hold whole and alike (the augmented images,
    each Transformer block's attention output and its sum with the skip, the logits), computed in training mode
    on a fixed batch by this engine's model, to a file named by this process."""

    def on_train_batch_end(self, batch, logs=None):
        if batch:
            return
        names = [layer.name for layer in self.model.layers]
        wanted = [self.model.get_layer("data_augmentation").output] + [
            layer.output for layer in self.model.layers
            if isinstance(layer, (layers.MultiHeadAttention, layers.Add))] + [self.model.outputs[0]]
        probe = keras.Model(self.model.inputs, wanted)
        values = probe(x_train[:16], training=True)
        np.savez(os.path.join({folder!r}, f"probe_{{os.getpid()}}.npz"), *[np.asarray(v) for v in values])
'''


def test_as_pasted_the_engines_compute_equal_replicated_activations_in_training(notebook, cluster):
    """With its random augmentation and dropout, each engine's replicated layers draw what one model draws (the same
    flips, rotations and zooms, the same dropout masks on gathered activations): after a training step the
    augmented images, the attention outputs and the logits are equal on both engines, and the augmentation drew
    (its images differ from the normalised input's)."""
    idle_engines(cluster, 2)
    folder = notebook.folder / "probe"
    folder.mkdir(exist_ok=True)
    for old in folder.glob("*.npz"):
        old.unlink()
    notebook.run(PROBE.format(folder=str(folder))).check()
    cell = ("%%distribute {line}\nvit_classifier = create_vit_classifier()\n"
            "vit_classifier.compile(optimizer=keras.optimizers.AdamW(learning_rate=learning_rate, "
            "weight_decay=weight_decay), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))\n"
            "vit_classifier.fit(x_train, y_train, batch_size=batch_size, epochs=1, steps_per_epoch=2, "
            "callbacks=[ReplicatedActivations()])\n")
    notebook.run(distributed(cell, "tensor"), timeout=240).check()
    files = sorted(folder.glob("probe_*.npz"))
    assert len(files) == 2, files
    engines = [np.load(path) for path in files]
    assert len(engines[0].files) == 1 + 2 * 3 + 1  # augmentation; 2 blocks of attention + 2 Adds; the logits
    for key in engines[0].files:  # a different draw differs by the activation's size; float rounding by an ulp
        np.testing.assert_allclose(engines[0][key], engines[1][key], rtol=1e-5, atol=1e-6, err_msg=key)
    normalised = notebook.value("np.asarray(data_augmentation.layers[0](x_train[:16])).tolist()")
    assert not np.allclose(engines[0]["arr_0"], np.asarray(normalised), atol=1e-3), "the augmentation drew nothing"


# plain Keras' spread of the MEASURE (the best epoch's test accuracy) over seeds 1-5, mean and sd: the plain line of
# the command above BOUNDS (seeds 1-5: 0.543, 0.492, 0.514, 0.570, 0.541; 2026-12-07)
PLAIN_SPREAD = (0.5320, 0.0300)


def test_as_pasted_tensor_accuracy_is_within_the_spread_of_plain_over_seeds(notebook, cluster):
    """The example as pasted, 4 epochs: `tensor --workers 2`'s test accuracy (seed 1) lies within plain Keras'
    spread over seeds 1-5, its mean and three standard deviations each side (measured: PLAIN_SPREAD, 0.44-0.62),
    far above the level of the fault keras-io's ViT showed (0.19-0.28 where local reached 0.59-0.65)."""
    idle_engines(cluster, 2)
    notebook.run(RESEED).check()
    notebook.run(distributed(RUN[0], "tensor"), timeout=CELL_TIMEOUT_S).check()
    tensor = notebook.value(MEASURE.expression)
    mean, sd = PLAIN_SPREAD
    print(f"test accuracy: tensor {tensor:.3f}; plain over seeds 1-5 {mean:.3f} sd {sd:.3f}")
    assert mean - 3 * sd <= tensor <= mean + 3 * sd, (tensor, PLAIN_SPREAD)

"""keras-io "Image similarity estimation using a Siamese Network with a contrastive loss" as a notebook with no
marks: pairs of images given to `fit` as a list of two arrays (`[x_train_1, x_train_2]`, and the validation pairs
the same way), one embedding network (a functional model) called on both, a `Lambda` distance, and a contrastive
loss the notebook defines as a closure (`loss(margin)`).

Source: https://github.com/keras-team/keras-io/blob/master/examples/vision/siamese_contrastive.py (Mehdi),
Apache License 2.0. Adapted: Keras 3 imports (`keras.ops` in the distance and the loss for `tf.math`); Fashion-MNIST
from nbdist.datasets instead of keras.datasets.mnist (offline): 6,000 training images (12,000 pairs), 1,000
validation and 1,000 test images; `random.seed(1)` so the pairs are the same every run; 6 epochs instead of 10
(at 3, plain Keras ends on the loss's plateau, 0.25, in half its runs: test accuracy 0.47-0.84); the plotting cells
left out.
"""

from __future__ import annotations

import sys

import pytest

from tests.keras_io.harness import STRATEGIES, Bound, Measure, history, run_example, trains_everywhere

SOURCE = "keras-team/keras-io examples/vision/siamese_contrastive.py"
LICENCE = "Apache-2.0"

SETUP = [
    '''
import random
import numpy as np
import keras
from keras import layers, ops
from nbdist.datasets import fashion_mnist

random.seed(1)
epochs = 6
batch_size = 16
margin = 1  # Margin for contrastive loss.
''',
    '''
(x_train_val, y_train_val), (x_test, y_test) = fashion_mnist(limit=7000)
x_test, y_test = x_test[:1000], y_test[:1000]

# Change the data type to a floating point format
x_train_val = x_train_val.astype("float32")
x_test = x_test.astype("float32")

x_train, x_val = x_train_val[:6000], x_train_val[6000:]
y_train, y_val = y_train_val[:6000], y_train_val[6000:]
del x_train_val, y_train_val


def make_pairs(x, y):
    """Creates a tuple containing image pairs with corresponding label."""
    num_classes = max(y) + 1
    digit_indices = [np.where(y == i)[0] for i in range(num_classes)]

    pairs = []
    labels = []

    for idx1 in range(len(x)):
        # add a matching example
        x1 = x[idx1]
        label1 = y[idx1]
        idx2 = random.choice(digit_indices[label1])
        x2 = x[idx2]

        pairs += [[x1, x2]]
        labels += [1]

        # add a non-matching example
        label2 = random.randint(0, num_classes - 1)
        while label2 == label1:
            label2 = random.randint(0, num_classes - 1)

        idx2 = random.choice(digit_indices[label2])
        x2 = x[idx2]

        pairs += [[x1, x2]]
        labels += [0]

    return np.array(pairs), np.array(labels).astype("float32")


pairs_train, labels_train = make_pairs(x_train, y_train)
pairs_val, labels_val = make_pairs(x_val, y_val)
pairs_test, labels_test = make_pairs(x_test, y_test)

x_train_1 = pairs_train[:, 0]
x_train_2 = pairs_train[:, 1]
x_val_1 = pairs_val[:, 0]
x_val_2 = pairs_val[:, 1]
x_test_1 = pairs_test[:, 0]
x_test_2 = pairs_test[:, 1]
''',
]

RUN = [
    '''
def euclidean_distance(vects):
    """Find the Euclidean distance between two vectors."""
    x, y = vects
    sum_square = ops.sum(ops.square(x - y), axis=1, keepdims=True)
    return ops.sqrt(ops.maximum(sum_square, keras.backend.epsilon()))


input = layers.Input((28, 28, 1))
x = layers.BatchNormalization()(input)
x = layers.Conv2D(4, (5, 5), activation="tanh")(x)
x = layers.AveragePooling2D(pool_size=(2, 2))(x)
x = layers.Conv2D(16, (5, 5), activation="tanh")(x)
x = layers.AveragePooling2D(pool_size=(2, 2))(x)
x = layers.Flatten()(x)

x = layers.BatchNormalization()(x)
x = layers.Dense(10, activation="tanh")(x)
embedding_network = keras.Model(input, x)


input_1 = layers.Input((28, 28, 1))
input_2 = layers.Input((28, 28, 1))

# As mentioned above, Siamese Network share weights between
# tower networks (sister networks). To allow this, we will use
# same embedding network for both tower networks.
tower_1 = embedding_network(input_1)
tower_2 = embedding_network(input_2)

merge_layer = layers.Lambda(euclidean_distance, output_shape=(1,))([tower_1, tower_2])
normal_layer = layers.BatchNormalization()(merge_layer)
output_layer = layers.Dense(1, activation="sigmoid")(normal_layer)
siamese = keras.Model(inputs=[input_1, input_2], outputs=output_layer)
''',
    '''
def loss(margin=1):
    """Provides 'contrastive_loss' an enclosing scope with variable 'margin'."""

    def contrastive_loss(y_true, y_pred):
        """Calculates the contrastive loss."""
        square_pred = ops.square(y_pred)
        margin_square = ops.square(ops.maximum(margin - (y_pred), 0))
        return ops.mean((1 - y_true) * square_pred + (y_true) * margin_square)

    return contrastive_loss
''',
    '''
siamese.compile(loss=loss(margin=margin), optimizer="RMSprop", metrics=["accuracy"])
siamese.summary()
''',
    '''%%distribute {line}
history = siamese.fit(
    [x_train_1, x_train_2],
    labels_train,
    validation_data=([x_val_1, x_val_2], labels_val),
    batch_size=batch_size,
    epochs=epochs,
)
''',
    '''
results = siamese.evaluate([x_test_1, x_test_2], labels_test)
print("test loss, test acc:", results)
''',
]

# pipeline: the embedding network, called on both inputs, falls whole in the first stage (both calls in one stage)
OUTCOMES = trains_everywhere()
MODEL = "siamese"
MEASURE = Measure("test accuracy", "float(results[1])")
# Measured: .venv/bin/python -m tests.keras_io.measure test_siamese_contrastive hfdt nfdt pipeline tensor --seeds 5
# (build/bounds/<module>.json). pipeline's mean is 0.032 below plain's, six times the spreads: a finding, its cause
# not yet found, reported in the issue (not a bound widened).
BOUNDS = {
    "hfdt": Bound(0.8647, "seeds 1-5: 0.886, 0.880, 0.882, 0.876, 0.873; mean 0.879 sd 0.005; plain 0.883 sd 0.005 "
                          "(gap -0.004); 2026-12-07"),
    "nfdt": Bound(0.8741, "seeds 1-5: 0.877, 0.881, 0.882, 0.884, 0.882; mean 0.881 sd 0.002; plain 0.883 sd 0.005 "
                          "(gap -0.001); 2026-12-07"),
    "pipeline": Bound(0.8303, "seeds 1-5: 0.854, 0.843, 0.849, 0.862, 0.849; mean 0.851 sd 0.007; plain 0.883 sd "
                              "0.005 (gap -0.032); 2026-12-07"),
    "tensor": Bound(0.8622, "seeds 1-5: 0.887, 0.879, 0.881, 0.891, 0.873; mean 0.882 sd 0.007; plain 0.883 sd 0.005 "
                            "(gap -0.001); 2026-12-07"),
}


def check(notebook, strategy):
    """The example: a siamese network whose test pairs are told apart (same class or not) by the distance of their
    embeddings (chance: 0.5; its test accuracy: MEASURE). Under every strategy that trains: the validation pairs
    read as a list too, and the loss fell."""
    loss = history(notebook, "loss")
    assert len(loss) == 6 and loss[-1] < loss[0], loss
    assert len(history(notebook, "val_loss")) == 6


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_example(notebook, plain_notebook, cluster, strategy):
    run_example(notebook, sys.modules[__name__], strategy, cluster, plain_notebook)

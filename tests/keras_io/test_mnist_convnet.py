"""keras-io "Simple MNIST convnet" as a notebook with no marks: a Sequential convnet on arrays.

Source: https://github.com/keras-team/keras-io/blob/master/examples/vision/mnist_convnet.py (fchollet),
Apache License 2.0. Adapted: Fashion-MNIST from nbdist.datasets instead of keras.datasets.mnist (offline),
4,096 training images, 8 and 16 filters instead of 32 and 64, 3 epochs instead of 15.
"""

from __future__ import annotations

import sys

import pytest

from tests.keras_io.harness import STRATEGIES, Bound, Measure, history, run_example, trains_everywhere

SOURCE = "keras-team/keras-io examples/vision/mnist_convnet.py"
LICENCE = "Apache-2.0"

SETUP = [
    '''
import numpy as np
import keras
from keras import layers
from nbdist.datasets import fashion_mnist
''',
    '''
# Model / data parameters
num_classes = 10
input_shape = (28, 28, 1)

# Load the data and split it between train and test sets
(x_train, y_train), (x_test, y_test) = fashion_mnist(limit=4096)

# Scale images to the [0, 1] range
x_train = x_train.astype("float32") / 255
x_test = x_test.astype("float32") / 255
# Make sure images have shape (28, 28, 1)
x_train = np.expand_dims(x_train, -1)
x_test = np.expand_dims(x_test, -1)
print("x_train shape:", x_train.shape)
print(x_train.shape[0], "train samples")
print(x_test.shape[0], "test samples")


# convert class vectors to binary class matrices
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)
''',
]

RUN = [
    '''
model = keras.Sequential(
    [
        keras.Input(shape=input_shape),
        layers.Conv2D(8, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(16, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(num_classes, activation="softmax"),
    ]
)

model.summary()
''',
    '''%%distribute {line}
batch_size = 128
epochs = 3

model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])

model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1)
''',
    '''
score = model.evaluate(x_test, y_test, verbose=0)
print("Test loss:", score[0])
print("Test accuracy:", score[1])
''',
]

OUTCOMES = trains_everywhere()
MODEL = "model"
MEASURE = Measure("test accuracy", "float(score[1])")
# measured (build/bounds/test_mnist_convnet.json):
#   .venv/bin/python -m tests.keras_io.measure test_mnist_convnet hfdt nfdt pipeline tensor --seeds 5
# value = the mean less 3 sd of the strategy's five runs, seeds 1-5
# a finding (reported): hfdt's mean is 0.012 and pipeline's 0.014 above plain's, more than either's spread or
# plain's (sd 0.010, 0.007; plain 0.012); the bounds are their own runs' spreads
BOUNDS = {
    "hfdt": Bound(0.6680, "seeds 1-5: 0.692, 0.688, 0.702, 0.700, 0.716; mean 0.700 sd 0.010; "
                          "plain 0.687 sd 0.012 (gap +0.012); 2026-12-07"),
    "nfdt": Bound(0.6567, "seeds 1-5: 0.697, 0.683, 0.695, 0.681, 0.711; mean 0.694 sd 0.012; "
                          "plain 0.687 sd 0.012 (gap +0.006); 2026-12-07"),
    "pipeline": Bound(0.6803, "seeds 1-5: 0.690, 0.701, 0.709, 0.702, 0.703; mean 0.701 sd 0.007; "
                              "plain 0.687 sd 0.012 (gap +0.014); 2026-12-07"),
    "tensor": Bound(0.6527, "seeds 1-5: 0.684, 0.674, 0.696, 0.681, 0.702; mean 0.687 sd 0.012; "
                            "plain 0.687 sd 0.012 (gap -0.000); 2026-12-07"),
}


def check(notebook, strategy):
    """The example: "a simple convnet that achieves ~99% test accuracy" (MNIST, 15 epochs). At 4,096 Fashion-MNIST
    images and 3 epochs: the loss fell (the test accuracy: MEASURE)."""
    loss = history(notebook, "loss")
    assert len(loss) == 3 and loss[-1] < loss[0], loss


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_example(notebook, plain_notebook, cluster, strategy):
    run_example(notebook, sys.modules[__name__], strategy, cluster, plain_notebook)

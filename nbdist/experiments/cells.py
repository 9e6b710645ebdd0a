"""What the comparisons train: the data, the models and the training cell, and the named set-ups."""

from __future__ import annotations

QUICK = {"workers": 4, "samples": 8000, "epochs": 2, "seeds": 1, "simulate": "speed=1,1,0.5,0.25"}
DEFAULT_STRATEGIES = "local,ssgd,asgd,asgd:momentum=0,dc-asgd-a,dc-asgdk,ddc-asgd"

DATA = '''
import keras
from nbdist.datasets import fashion_mnist
(x, y), (x_test, y_test) = fashion_mnist(limit={samples})
x, x_test = x.astype("float32") / 255, x_test.astype("float32") / 255
'''
# mlp: 0.4 MB of weights and ~1 ms of compute per step on a CPU (communication-bound);
# cnn: 0.1 MB and tens of ms per step (compute-bound), where unequal compute speeds matter most
MODELS = {
    "mlp": '''
def build():
    return keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(),
                             keras.layers.Dense({hidden}, activation="relu"), keras.layers.Dense(10, activation="softmax")])
''',
    "cnn": '''
def build():
    return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
                             keras.layers.MaxPooling2D(), keras.layers.Conv2D(32, 3, activation="relu"),
                             keras.layers.MaxPooling2D(), keras.layers.Flatten(),
                             keras.layers.Dense(10, activation="softmax")])
''',
    # cnn-wide: the CNN with a 1536-unit dense layer, 5.0 MB of weights, where a 50 Mbit/s link weighs
    "cnn-wide": '''
def build():
    return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
                             keras.layers.MaxPooling2D(), keras.layers.Conv2D(32, 3, activation="relu"),
                             keras.layers.MaxPooling2D(), keras.layers.Flatten(),
                             keras.layers.Dense(1536, activation="relu"), keras.layers.Dense(10, activation="softmax")])
''',
}

TRAIN = '''
model = build()
model.compile(optimizer=keras.optimizers.SGD({lr}, momentum={momentum}),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size={batch}, epochs={epochs}, validation_data=(x_test, y_test), verbose=0)
'''

# The set-ups of docs/results.md (issue 17: S1-S4, the DDC-ASGD claim; issue 18: H1, H2, ASHL's).
HETEROGENEOUS = "speed=1,1,0.5,0.25; bandwidth=1g,1g,200m,50m"
SETUPS = {
    "S1": {"simulate": "speed=1,1,1,1,0.5,0.5,0.25,0.25", "lr": 0.05},
    "S2": {"simulate": "speed=1,1,1,1,0.5,0.5,0.25,0.1", "lr": 0.1},
    "S3": {"simulate": "speed=1,1,0.2,0.1", "lr": 0.05},
    "S4": {"simulate": "speed=" + ",".join(["1"] * 16), "lr": 0.02},
    "H1": {"simulate": HETEROGENEOUS, "model": "cnn"},
    "H2": {"simulate": HETEROGENEOUS, "model": "cnn-wide"},
}

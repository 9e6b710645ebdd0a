"""keras-io "Structured data classification with FeatureSpace" as a notebook with no marks: a pandas DataFrame
turned into `tf.data` pipelines in plain cells, a `keras.utils.FeatureSpace` (normalisation, discretisation,
string and integer lookups, hashed crosses) adapted in the notebook and mapped over the pipelines, a training
model compiled in a plain cell, and an inference model sharing its layers, used after training.

Source: https://github.com/keras-team/keras-io/blob/master/examples/structured_data/
structured_data_classification_with_feature_space.py (fchollet), Apache License 2.0. Adapted: the notebook writes
heart.csv with 400 generated patients of the Cleveland data's columns and value ranges (the target a noisy function
of cp, thalach, oldpeak, exang, ca and thal) and reads it with pandas (offline); 10 epochs instead of 20; the
preview cells (head, take(1)) left out.
"""

from __future__ import annotations

import sys

import pytest

from tests.keras_io.harness import STRATEGIES, Bound, Measure, history, run_example, trains_everywhere

SOURCE = ("keras-team/keras-io examples/structured_data/"
          "structured_data_classification_with_feature_space.py")
LICENCE = "Apache-2.0"

SETUP = [
    '''
import tensorflow as tf
import pandas as pd
import keras
from keras.utils import FeatureSpace
''',
    # offline: a CSV of the example's columns, generated, where the example downloads heart.csv
    '''
import numpy as np

rng = np.random.default_rng(0)
n = 400
columns = {
    "age": rng.integers(29, 78, n), "sex": rng.integers(0, 2, n), "cp": rng.integers(0, 5, n),
    "trestbps": rng.integers(94, 201, n), "chol": rng.integers(126, 565, n), "fbs": rng.integers(0, 2, n),
    "restecg": rng.integers(0, 3, n), "thalach": rng.integers(71, 203, n), "exang": rng.integers(0, 2, n),
    "oldpeak": np.round(rng.uniform(0, 6.2, n), 1), "slope": rng.integers(1, 4, n), "ca": rng.integers(0, 4, n),
    "thal": rng.choice(["normal", "fixed", "reversible"], n),
}
risk = (0.8 * (columns["cp"] == 4) - 0.03 * (columns["thalach"] - 140) + 0.6 * columns["oldpeak"]
        + 0.9 * columns["exang"] + 0.7 * columns["ca"] + 1.2 * (columns["thal"] == "reversible")
        - 3.0 + rng.normal(0, 0.5, n))
columns["target"] = (risk > 0).astype(int)
pd.DataFrame(columns).to_csv("heart.csv", index=False)
''',
    '''
file_url = "heart.csv"  # offline: the file written above
dataframe = pd.read_csv(file_url)
''',
    '''
print(dataframe.shape)
''',
    '''
val_dataframe = dataframe.sample(frac=0.2, random_state=1337)
train_dataframe = dataframe.drop(val_dataframe.index)

print(
    "Using %d samples for training and %d for validation"
    % (len(train_dataframe), len(val_dataframe))
)
''',
    '''
def dataframe_to_dataset(dataframe):
    dataframe = dataframe.copy()
    labels = dataframe.pop("target")
    ds = tf.data.Dataset.from_tensor_slices((dict(dataframe), labels))
    ds = ds.shuffle(buffer_size=len(dataframe))
    return ds


train_ds = dataframe_to_dataset(train_dataframe)
val_ds = dataframe_to_dataset(val_dataframe)
''',
    '''
train_ds = train_ds.batch(32)
val_ds = val_ds.batch(32)
''',
    '''
feature_space = FeatureSpace(
    features={
        # Categorical features encoded as integers
        "sex": FeatureSpace.integer_categorical(num_oov_indices=0),
        "cp": FeatureSpace.integer_categorical(num_oov_indices=0),
        "fbs": FeatureSpace.integer_categorical(num_oov_indices=0),
        "restecg": FeatureSpace.integer_categorical(num_oov_indices=0),
        "exang": FeatureSpace.integer_categorical(num_oov_indices=0),
        "ca": FeatureSpace.integer_categorical(num_oov_indices=0),
        # Categorical feature encoded as string
        "thal": FeatureSpace.string_categorical(num_oov_indices=0),
        # Numerical features to discretize
        "age": FeatureSpace.float_discretized(num_bins=30),
        # Numerical features to normalize
        "trestbps": FeatureSpace.float_normalized(),
        "chol": FeatureSpace.float_normalized(),
        "thalach": FeatureSpace.float_normalized(),
        "oldpeak": FeatureSpace.float_normalized(),
        "slope": FeatureSpace.float_normalized(),
    },
    # Specify feature cross with a custom crossing dim.
    crosses=[
        FeatureSpace.cross(feature_names=("sex", "age"), crossing_dim=64),
        FeatureSpace.cross(
            feature_names=("thal", "ca"),
            crossing_dim=16,
        ),
    ],
    output_mode="concat",
)
''',
    '''
train_ds_with_no_labels = train_ds.map(lambda x, _: x)
feature_space.adapt(train_ds_with_no_labels)
''',
    '''
preprocessed_train_ds = train_ds.map(
    lambda x, y: (feature_space(x), y), num_parallel_calls=tf.data.AUTOTUNE
)
preprocessed_train_ds = preprocessed_train_ds.prefetch(tf.data.AUTOTUNE)

preprocessed_val_ds = val_ds.map(
    lambda x, y: (feature_space(x), y), num_parallel_calls=tf.data.AUTOTUNE
)
preprocessed_val_ds = preprocessed_val_ds.prefetch(tf.data.AUTOTUNE)
''',
]

RUN = [
    '''
dict_inputs = feature_space.get_inputs()
encoded_features = feature_space.get_encoded_features()

x = keras.layers.Dense(32, activation="relu")(encoded_features)
x = keras.layers.Dropout(0.5)(x)
predictions = keras.layers.Dense(1, activation="sigmoid")(x)

training_model = keras.Model(inputs=encoded_features, outputs=predictions)
training_model.compile(
    optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"]
)

inference_model = keras.Model(inputs=dict_inputs, outputs=predictions)
''',
    '''%%distribute {line}
training_model.fit(
    preprocessed_train_ds,
    epochs=10,
    validation_data=preprocessed_val_ds,
    verbose=2,
)
''',
    '''
sample = {
    "age": 60,
    "sex": 1,
    "cp": 1,
    "trestbps": 145,
    "chol": 233,
    "fbs": 1,
    "restecg": 2,
    "thalach": 150,
    "exang": 0,
    "oldpeak": 2.3,
    "slope": 3,
    "ca": 0,
    "thal": "fixed",
}

input_dict = {name: keras.ops.convert_to_tensor([value]) for name, value in sample.items()}
predictions = inference_model.predict(input_dict)

print(
    f"This particular patient had a {100 * predictions[0][0]:.2f}% probability "
    "of having a heart disease, as evaluated by our model."
)
''',
]

OUTCOMES = trains_everywhere()
# A known gap (docs/keras-semantics.md, "Left"): `feature_space.adapt(train_ds_with_no_labels)` iterates the notebook's
# train_ds, an unseeded `shuffle` that reshuffles at each iteration, so plain's fit starts at its second order; the
# engine remakes the pipeline from its statements (adapt is not among them: the adapted FeatureSpace travels as
# itself), so its fit starts at the first. Found by the state oracle (13 addresses, 2026-12-07), not yet fixed.
LOCAL_DIFFERS = "the notebook's adapt iterated the shuffled pipeline before fit; the engine's copy was not iterated"
MODEL = "training_model"
# the fit's History (the cell does not keep it; Keras leaves it on the model, as nbdist does): the last epoch's
MEASURE = Measure("validation accuracy", "float(training_model.history.history['val_accuracy'][-1])")
# Measured: .venv/bin/python -m tests.keras_io.measure test_structured_data_classification_with_feature_space hfdt
# nfdt pipeline tensor --seeds 5 (build/bounds/<module>.json). Under hfdt and nfdt the validation dataset is sharded
# by batch and cut to the same number of batches on each worker, so its last partial batch (16 of 80 patients) is
# not validated: their accuracies are over 64 patients, plain's and pipeline's over 80. tensor's mean is 0.108 below
# plain's, twice plain's spread: a finding, its cause not yet found, reported in the issue (not a bound widened).
BOUNDS = {
    "hfdt": Bound(0.7903, "seeds 1-5: 0.875, 0.859, 0.828, 0.891, 0.891; mean 0.869 sd 0.026; plain 0.832 sd 0.055 "
                          "(gap +0.036); 2026-12-07"),
    "nfdt": Bound(0.7310, "seeds 1-5: 0.859, 0.828, 0.812, 0.875, 0.922; mean 0.859 sd 0.043; plain 0.832 sd 0.055 "
                          "(gap +0.027); 2026-12-07"),
    "pipeline": Bound(0.7687, "seeds 1-5: 0.825, 0.863, 0.825, 0.875, 0.887; mean 0.855 sd 0.029; plain 0.832 sd "
                              "0.055 (gap +0.023); 2026-12-07"),
    "tensor": Bound(0.6720, "seeds 1-5: 0.738, 0.712, 0.712, 0.750, 0.712; mean 0.725 sd 0.018; plain 0.832 sd 0.055 "
                            "(gap -0.108); 2026-12-07"),
}


def check(notebook, strategy):
    """The example: "We quickly get to 80% validation accuracy" (MEASURE), then the inference model (the
    FeatureSpace and the trained layers) gives one patient's probability. On the generated patients: 10 epochs of
    validation, the training loss fell, and the inference model, which shares the training model's layers,
    predicts the probability the trained model gives the encoded features."""
    accuracy, loss = history(notebook, "val_accuracy"), history(notebook, "loss")
    assert len(loss) == 10 and loss[-1] < loss[0], loss
    assert len(accuracy) == 10, accuracy
    probability = notebook.value("float(predictions[0][0])")
    assert 0.0 <= probability <= 1.0
    # two numbers of the same run that must agree: the same layers on the same encoded features, through the
    # inference model's graph and the training model's (float rounding)
    end_to_end = notebook.value("float(training_model.predict(feature_space(input_dict), verbose=0)[0][0])")
    assert abs(end_to_end - probability) < 1e-5, (end_to_end, probability)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_example(notebook, plain_notebook, cluster, strategy):
    run_example(notebook, sys.modules[__name__], strategy, cluster, plain_notebook)

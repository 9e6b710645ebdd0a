"""Where nbdist meets Keras: `fit` intercepted and its arguments checked (`keras_bridge`), the cell's callbacks,
optimizer state and learning rates as Keras keeps them, what a cell's text says about how it trains
(`training_code`), the optimizer step as the seam (`step_seam`), several steps per call (`fused_steps`), and
weights that exist without values (`empty_weights`)."""

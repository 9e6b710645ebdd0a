"""Models too large for one engine: the notebook's model by parts (`desk`), weights kept on the engines and
sharded checkpoints, the notebook's models synced to the engines (`model_sync`), and the two ways to cut a
model: between layers (`pipeline`) and within layers (`tensor_parallel`)."""

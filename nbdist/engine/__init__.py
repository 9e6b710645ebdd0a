"""The engine's side: a `%%distribute` cell inside an ipyparallel engine. The status probe and the training
cell under its strategy (`engine`), one statement at a time (`cell_runner`), a hand-written loop's data and what
it leaves behind (`loop_data`, `loop_state`), and the metric records it publishes (`reporter`, `telemetry`).
Imports nothing of the notebook's side."""

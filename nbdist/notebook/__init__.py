"""The notebook's side: everything that runs in the notebook's kernel. The `Session` (the cluster handle, the
recorded definition cells, the runs) and a `Run` from submission to results; what a cell brings from the notebook
(`bring`); the results installed in the notebook's model; progress, reports, the dashboard (`widgets`) and the
JupyterLab sidebar's channel. Nothing below imports it."""

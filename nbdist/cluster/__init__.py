"""The cluster, as the kernel holds it: start or connect, the engines' inventory, liveness and signals
(`cluster`); what nbdist started stops with its kernel (`lifeline`); engines as hosts of a given memory
(`memory_caps`); whether the engines can run what the notebook defines (`compat`)."""

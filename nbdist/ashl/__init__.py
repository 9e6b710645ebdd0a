"""ASHL (DESIGN.md section 6): profiling-based allocation, the AHL -> SHL switch rule, compression policy.

Pure decisions, no I/O: the strategy that drives them (`--strategy ashl`) is not built yet.
"""

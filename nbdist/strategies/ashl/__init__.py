"""ASHL (DESIGN.md section 6): profiling, allocation, the AHL -> SHL switch rule, the kernel's coordinator.

The pure decisions (allocation, switch) do no I/O; `coordinator` applies them to a run;
the strategy itself is `strategy`.
"""

"""One process on one host, the kernel or an engine: what it knows of its host (`facts`, `netroute`), the GPUs
and cores it shares with the host's other engines (`gpus`, `threads`), an engine's namespace and its interrupts
(`namespace`, `interrupt_guard`), and how fast its steps run, timed or simulated (`step_timer`, `hetero`).
Imports only leaves."""

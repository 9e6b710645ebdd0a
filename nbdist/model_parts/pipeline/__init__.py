"""Model parallelism between layers (`--strategy pipeline`, DESIGN.md section 9).

`split`: cutting a Keras model into consecutive stages and balancing them; `schedule`: the
order of micro-batch forwards and backwards on each stage (1F1B, GPipe); `links`: the signed
ZeroMQ links between neighbouring stages and the kernel's address book; `stage`: one stage's
Keras model, whose train step runs the schedule.
"""

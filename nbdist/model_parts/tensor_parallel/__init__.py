"""Model parallelism within layers (`--strategy tensor`, DESIGN.md section 9): which layers split
(`plan`), the split layers and the collectives that join their slices (`layers`), and the whole
model built from and reassembled into the cell's own (`model`)."""

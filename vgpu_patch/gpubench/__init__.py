"""What the shim's SM limits do on a real GPU, beside bare time-slicing and MPS: region_gpu.c (the one GPU program,
shipped beside this file), how it is built and started (program), the co-tenant shares (shares), decode-like steps
(steps), cold start and limit onset (onset), MPS (mps) and the whole run `vgpu-patch bench` makes (suite).

The bench/ scripts and tests/gpu measure with the same code, so their figures and the command's compare."""

PARTS = ("steps", "shares", "onset")  # what `vgpu-patch bench` runs, in its order

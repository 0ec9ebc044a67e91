"""ELF reading and drop-in rules behind `vgpu-patch check`; the public API is `vgpu_patch.elfcheck`."""

"""ELF reading and drop-in rules behind `vgpu-patch check`; the public API is `vgpu_patch.elf.check`."""

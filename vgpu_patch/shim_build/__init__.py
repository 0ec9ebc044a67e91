"""Building the shim: the toolchain and headers it needs, where its C sources are and what they export
(hooks.def), the build itself with its manifest, and the rebuild that checks a manifest
(`vgpu-patch build`). The ELF proof of a built library lives in `vgpu_patch.elf.proof`."""

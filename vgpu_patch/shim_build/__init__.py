"""Building the shim: the toolchain and headers it needs, where its C sources are and what they export
(hooks.def), the build itself with its manifest, the rebuild that checks a manifest (`vgpu-patch build`),
and the vendor stand-in the demo deploys over (standin). The ELF proof of a built library lives in
`vgpu_patch.elf.proof`."""

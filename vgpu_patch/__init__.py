"""vgpu-patch: build, verify and hot-swap a fixed HAMi-compatible libvgpu.so."""

__version__ = "0.1.0"

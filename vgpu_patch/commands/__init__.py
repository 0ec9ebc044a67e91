"""Subcommands of the vgpu-patch CLI, one module each."""

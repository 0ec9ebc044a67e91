"""What a release of the shim carries and how it is proven: the one sha256 helper (digest), ssh-keygen
signatures (signing), the build's in-toto provenance statement (provenance), and where this copy of
vgpu-patch itself was installed from (install: `--version` and every "install the extra" hint)."""

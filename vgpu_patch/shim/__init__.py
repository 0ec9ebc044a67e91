"""The running shim's formats, read from Python: HAMi's shared region (region, mirroring
c_src/region/layout.h) and the memory/SM limit grammar (limits, mirroring c_src/limits/parse.c)."""

"""Recording stand-in for the CUDA driver library, used by CPU-only tests."""

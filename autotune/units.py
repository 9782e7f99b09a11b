"""Units the package counts in: bytes per GiB (CUDA and the datasheets' "GB" of device memory)."""

GIB = 2**30
"""Bytes in a GiB."""

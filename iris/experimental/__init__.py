"""Memory from providers other than iris's own allocators (PyTorch symmetric memory, NVSHMEM),
described by address maps that iris's device functions translate against. Nothing here is
imported by `import iris`: each provider loads its own package when it is built."""

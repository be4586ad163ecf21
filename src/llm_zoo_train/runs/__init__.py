"""A run's process and files: run directory, lock, checkpoints, manifests, seeds, threads, interrupts, finite checks."""

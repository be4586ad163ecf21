"""Evaluation of a run, a checkpoint or a config on held-out problems; the eval command line."""

"""The formatters of RESULTS.md's sections, one module per group of benchmarks (envs, rollouts,
trainer, learning, rewards), with the table and preamble helpers they share in ``format``.

``report.py`` lists the sections in order and writes the file; it is still the command.
"""

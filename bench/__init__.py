"""Benchmarks of the durable execution system: ``python -m bench`` (see ``bench/__main__.py``).

Everything runs in one process against embedded Redis servers the benchmark starts itself
(``durable.harness.Server``: random ports, private temp directories, real ``appendfsync``),
with worker processes from ``durable.harness.Worker``. Items are interleaved and repeated;
the reports carry medians and ratios.
"""

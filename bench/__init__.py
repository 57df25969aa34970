"""Benchmarks of the durable execution system: ``python -m bench`` (see ``bench/__main__.py``).

Everything runs in one process against embedded Redis servers the benchmark starts itself
(``durable.testing.Server``: random ports, private temp directories, real ``appendfsync``),
with worker processes from ``durable.testing.Worker``. Items are interleaved and repeated;
the reports carry medians and ratios.
"""

"""Benchmark and check machinery; ``scripts/*.py`` are its command-line wrappers.

Shared parts: :mod:`~nmt.bench.machine` (device facts, matmul peak, CPU load),
:mod:`~nmt.bench.memory` (resident memory of a process or a process tree, peaks),
:mod:`~nmt.bench.timing` (timed training steps and decoding runs), :mod:`~nmt.bench.report`
(progress lines, tables, JSON output, a run's summary). One module per benchmark:
:mod:`~nmt.bench.speed` (``make bench``), :mod:`~nmt.bench.joeynmt` (``make bench-joeynmt``),
:mod:`~nmt.bench.data_scale` (``make bench-data``), :mod:`~nmt.bench.soak` (``make
bench-soak``), :mod:`~nmt.bench.serve` (``make bench-serve``), :mod:`~nmt.bench.gpu_check`
(``make gpu-check``) and :mod:`~nmt.bench.results_table`.

Nothing is imported here: :mod:`~nmt.bench.gpu_check` must load on a Python that has only the
standard library (before the wheels it installs are there).
"""

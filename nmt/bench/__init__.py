"""Benchmarks and checks, on top of every other layer; ``scripts/*.py`` are their command lines.

Shared parts: :mod:`~nmt.bench.machine` (device facts, matmul peak, CPU load),
:mod:`~nmt.bench.memory` (resident memory of a process or a process tree, peaks),
:mod:`~nmt.bench.timing` (timed training steps and decoding runs), :mod:`~nmt.bench.flops`
(model FLOPs from a config), :mod:`~nmt.bench.report` (progress lines, tables, JSON output, a
run's summary). The benchmarks: :mod:`~nmt.bench.speed` (``make bench``),
:mod:`~nmt.bench.joeynmt` with :mod:`~nmt.bench.joeynmt_setup`, :mod:`~nmt.bench.joeynmt_run`
and :mod:`~nmt.bench.joeynmt_report` (``make bench-joeynmt``), :mod:`~nmt.bench.data_scale`
(``make bench-data``), :mod:`~nmt.bench.soak` (``make bench-soak``), :mod:`~nmt.bench.serve`
with :mod:`~nmt.bench.serve_load` (``make bench-serve``), :mod:`~nmt.bench.gpu_check` with
:mod:`~nmt.bench.gpu_wheels` and :mod:`~nmt.bench.gpu_check_report` (``make gpu-check``) and
:mod:`~nmt.bench.results_table`. May import every other part of nmt but :mod:`nmt.docs`.

Nothing is imported here: :mod:`~nmt.bench.gpu_check` must load on a Python that has only the
standard library (before the wheels it installs are there).
"""

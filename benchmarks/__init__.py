"""Benchmarks and checks of the nmt package, kept in the checkout beside it and never installed
with it; ``scripts/*.py`` are their command lines.

Shared parts: :mod:`~benchmarks.machine` (device facts, matmul peak, CPU load),
:mod:`~benchmarks.memory` (resident memory of a process or a process tree, peaks),
:mod:`~benchmarks.timing` (timed training steps and decoding runs), :mod:`~benchmarks.flops`
(model FLOPs from a config), :mod:`~benchmarks.report` (progress lines, tables, JSON output, a
run's summary). The benchmarks: :mod:`~benchmarks.speed` (``make bench``),
:mod:`~benchmarks.joeynmt` with :mod:`~benchmarks.joeynmt_setup`, :mod:`~benchmarks.joeynmt_run`
and :mod:`~benchmarks.joeynmt_report` (``make bench-joeynmt``), :mod:`~benchmarks.data_scale`
(``make bench-data``), :mod:`~benchmarks.soak` (``make bench-soak``), :mod:`~benchmarks.serve`
with :mod:`~benchmarks.serve_load` (``make bench-serve``), :mod:`~benchmarks.gpu_check` with
:mod:`~benchmarks.gpu_check_env`, :mod:`~benchmarks.gpu_check_parts`,
:mod:`~benchmarks.gpu_check_runs`, :mod:`~benchmarks.gpu_check_quality`,
:mod:`~benchmarks.gpu_wheels` and :mod:`~benchmarks.gpu_check_report` (``make gpu-check``) and
:mod:`~benchmarks.results_table`. May import every part of nmt (nothing in nmt imports
them) but not :mod:`docs.hooks`.

Nothing is imported here: :mod:`~benchmarks.gpu_check` must load on a Python that has only the
standard library (before the wheels it installs are there), and without importing nmt, which
refuses a PyTorch below its floor (the check reports that first).
"""

"""Evaluation: sacreBLEU, chrF and TER with confidence intervals and the paired bootstrap test
(:mod:`~nmt.evaluate.metrics`), ``nmt-eval`` (:mod:`~nmt.evaluate.scoring`; also
``python -m nmt.evaluate``) and ``nmt-tune-decode`` (:mod:`~nmt.evaluate.tune_decode`). May
import everything up to :mod:`nmt.decode`.
"""

"""Shipping a model: ``nmt-export`` (:mod:`~nmt.ship.export`), the CTranslate2 converter
(:mod:`~nmt.ship.ctranslate2`) and the HTTP server ``nmt-serve`` (:mod:`~nmt.ship.serve`). May
import every layer up to :mod:`nmt.evaluate`; nothing but :mod:`nmt.bench` imports it.
"""

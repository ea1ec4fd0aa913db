"""Shipping a model: ``nmt-export`` (:mod:`~nmt.ship.export`), the CTranslate2 converter
(:mod:`~nmt.ship.ctranslate2`) and the Hugging Face export (:mod:`~nmt.ship.hf`). May import
every layer up to :mod:`nmt.evaluate`; nothing in the package
imports it. The server that answers with a package is :mod:`nmt.serve`.
"""

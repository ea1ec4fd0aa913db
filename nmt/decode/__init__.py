"""Decoding: from a trained model to translations. The options (:mod:`~nmt.decode.options`),
greedy and beam search (:mod:`~nmt.decode.search`), the engines that run them (our search, the
int8 GRU, CTranslate2: :mod:`~nmt.decode.engines`, :mod:`~nmt.decode.ct2`) and
``nmt-translate`` (:mod:`~nmt.decode.translate`). May import everything below it: the ground
floor, :mod:`nmt.data`, :mod:`nmt.models`, :mod:`nmt.runtime`, :mod:`nmt.store`.
"""

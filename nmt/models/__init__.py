"""Models: attention (:mod:`~nmt.models.attention`), the GRU encoder with the Bahdanau decoder
(:mod:`~nmt.models.gru`), the Transformer (:mod:`~nmt.models.transformer`), what both share
(:mod:`~nmt.models.base`), the loss and dropout with their plain references
(:mod:`~nmt.models.loss`, :mod:`~nmt.models.dropout`), what ``torch.compile`` leaves out of its
graphs (:mod:`~nmt.models.compile_exclusion`), several trained models decoding as one
(:mod:`~nmt.models.ensemble`), and the closed set of registered architectures
(:mod:`~nmt.models.registry`). Plain PyTorch modules: they import only PyTorch
and each other, never a config, a file or another part of nmt.
"""

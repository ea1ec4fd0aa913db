"""Data: from text files to token batches.

Multi30k and ``data=parallel`` corpora (:mod:`~nmt.data.corpus`, :mod:`~nmt.data.splits`),
sentencepiece tokenizers (:mod:`~nmt.data.tokenizer`, their training drawn as a bar by
:mod:`~nmt.data.spm_progress`), the prepared training data on disk (:mod:`~nmt.data.cache`,
built by :mod:`~nmt.data.binarize`; ``nmt-prepare`` is :mod:`~nmt.data.prepare`), datasets and
evaluation sets (:mod:`~nmt.data.datasets`), token-budget batches (:mod:`~nmt.data.batching`)
and each epoch's pairs under a sampled segmentation (:mod:`~nmt.data.resegment`). May import
the ground floor (:mod:`nmt.cli`, :mod:`nmt.config`, :mod:`nmt.atomic`, :mod:`nmt.environment`)
and nothing else of nmt; none of it but batching imports PyTorch.
"""

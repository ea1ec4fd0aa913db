"""nmt: attention-based neural machine translation (GRU + Bahdanau attention, Transformer).

The package is built in layers; each sub-package's docstring says what lives there and what it
may import. From the ground up:

* the ground floor, imported by everything: :mod:`nmt.environment` (every environment
  variable), :mod:`nmt.cli` (errors, exit status, logging, the config directory),
  :mod:`nmt.atomic` (atomic files, checksums), :mod:`nmt.config` (the typed config schema);
* :mod:`nmt.data` (corpora, tokenizers, the prepared cache, batches) and :mod:`nmt.models`
  (attention, the GRU and Transformer, the loss), which do not import each other;
* :mod:`nmt.runtime` (devices, precision, distributed processes);
* :mod:`nmt.store` (checkpoints, run directories, model packages, and loading them through
  one gate);
* :mod:`nmt.decode` (search, decoding options, the engines, ``nmt-translate``);
* :mod:`nmt.evaluate` (metrics, ``nmt-eval``, ``nmt-tune-decode``) and :mod:`nmt.viz`
  (attention pictures, the explorer page, ``nmt-attention``);
* :mod:`nmt.train` (the training loop and ``nmt-train``) and :mod:`nmt.ship` (``nmt-export``,
  the CTranslate2 converter, ``nmt-serve``).

Outside the package, in the repository: the benchmarks (``benchmarks/``, run through
``scripts/``) and the documentation site's generator (``docs/hooks/``), both consumers that may
import any layer and are never imported by it.
"""

from nmt.environment import set_onednn_cache_capacity

__version__ = "0.1.0"

# oneDNN reads its cache sizes when it first builds a kernel: before any model runs
set_onednn_cache_capacity()

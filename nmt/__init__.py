"""nmt: attention-based neural machine translation (GRU + Bahdanau attention, Transformer)."""

import os

__version__ = "0.1.0"

# PyTorch runs bf16 matrix products on a CPU with oneDNN, which keeps what it builds for each
# operation and tensor shape in two process-wide caches of 1,024 entries: oneDNN's primitive
# cache and ideep's (LRU_CACHE_CAPACITY). Token batches have many shapes, and a bf16 training
# run on a CPU grew by gigabytes of resident memory over 30 minutes as the caches filled (fp32
# does not use them and stays flat). Sixteen entries each keep bf16 training flat at the same
# speed (README, "GPU, CPU and several GPUs"). Both are read when oneDNN first builds a
# kernel, so they are set here, before any model runs; values in the environment win.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")
os.environ.setdefault("LRU_CACHE_CAPACITY", "16")

"""Runtime: the machine a command runs on. Devices and autocast (:mod:`~nmt.runtime.device`),
the precision a run trains and decodes in, measured where it must be
(:mod:`~nmt.runtime.precision`), and the process group of distributed training
(:mod:`~nmt.runtime.distributed`). May import the ground floor and :mod:`nmt.data`.
"""

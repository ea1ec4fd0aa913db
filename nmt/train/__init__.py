"""Training: ``nmt-train`` (:mod:`~nmt.train.command`; ``python -m nmt.train``). One update
(:mod:`~nmt.train.step`), validation (:mod:`~nmt.train.validation`), the loop
(:mod:`~nmt.train.loop`), what is set up before it (:mod:`~nmt.train.setup`) and the parts
the loop is built from (:mod:`~nmt.train.build`), where a resumed or fine-tuned run starts
(:mod:`~nmt.train.start`), optimisers and schedules (:mod:`~nmt.train.optim`), the run's
events (:mod:`~nmt.train.runlog`) and the sweep summary (:mod:`~nmt.train.sweep`). May import
every layer below it; nothing in the package imports it.
"""

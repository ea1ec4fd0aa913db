"""The documentation site's generated parts, written from the code and the data of record of a
checkout so that they cannot drift (``make docs``; scripts/docs_reference.py is the mkdocs
hook and the command line).

The sections a page names with ``<!-- nmt:NAME -->`` (:mod:`~docs.hooks.sections`): config keys
from the typed schema (:mod:`~docs.hooks.schema`, :mod:`~docs.hooks.configuration`), the commands'
options and the make targets (:mod:`~docs.hooks.commands`), the run files and packages
(:mod:`~docs.hooks.run_files`), the environment variables (:mod:`~docs.hooks.environment`), the
source the concept pages explain (:mod:`~docs.hooks.listings`) and the attention pooling demo
(:mod:`~docs.hooks.pooling`); the figures of the results (:mod:`~docs.hooks.figures`), formulas as
MathML (:mod:`~docs.hooks.mathml`), text helpers (:mod:`~docs.hooks.markdown`) and the mkdocs
hooks (:mod:`~docs.hooks.hooks`). It lives in the checkout beside the pages, never installed
with nmt. May import every part of nmt (nothing in nmt imports it) but not :mod:`benchmarks`,
whose commands it does not document; mkdocs, matplotlib and latex2mathml only inside the
functions that need them.
"""

"""The documentation site's generated parts, written from the code and the data of record of a
checkout so that they cannot drift (``make docs``; scripts/docs_reference.py is the mkdocs
hook and the command line).

The sections a page names with ``<!-- nmt:NAME -->`` (:mod:`~nmt.docs.sections`): config keys
from the typed schema (:mod:`~nmt.docs.schema`, :mod:`~nmt.docs.configuration`), the commands'
options and the make targets (:mod:`~nmt.docs.commands`), the run files and packages
(:mod:`~nmt.docs.run_files`), the environment variables (:mod:`~nmt.docs.environment`), the
source the concept pages explain (:mod:`~nmt.docs.listings`) and the attention pooling demo
(:mod:`~nmt.docs.pooling`); the figures of the results (:mod:`~nmt.docs.figures`), formulas as
MathML (:mod:`~nmt.docs.mathml`), text helpers (:mod:`~nmt.docs.markdown`) and the mkdocs
hooks (:mod:`~nmt.docs.hooks`). May import every part of nmt but :mod:`nmt.bench`, whose
commands it does not document; mkdocs, matplotlib and latex2mathml only inside the functions
that need them.
"""

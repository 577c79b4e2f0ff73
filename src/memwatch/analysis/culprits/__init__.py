"""Culprit forensics: what grew and who holds it. Everything here runs at checks only, never per
step, and everything that walks the live heap lives here (the rules only read its values).

The vocabulary (:mod:`.evidence`: censuses, growths, holders, attributions) and how a culprit
reads (:mod:`.wording`) are plain values and pure functions. The instruments: a census of live
tensors and large containers (:mod:`.census`, with autograd graphs :mod:`.graphs` and weighed
Python objects :mod:`.weigh`), the holder walk (:mod:`.holders`, one hop at a time in
:mod:`.referrers`, running frames in :mod:`.frames`, names in :mod:`.names`), allocation sites
(:mod:`.allocations` and :mod:`.sites` for tracemalloc, :mod:`.device_sites` for the device
allocator's history, judged in :mod:`.traced`), DataLoaders that keep workers (:mod:`.loaders`),
and one answer to "is this the user's code, or memwatch's own?" (:mod:`.ownership`).
:class:`.live.LiveEvidence` puts them behind the analyzer's one port
(:class:`memwatch.analysis.evidence.Evidence`).
"""

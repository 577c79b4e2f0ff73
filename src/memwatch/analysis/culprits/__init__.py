"""Culprit forensics: what grew and who holds it. Everything here runs at checks only, never per
step, and everything that walks the live heap lives here (the rules only read its values,
:mod:`memwatch.analysis.evidence`).

A culprit is found in four stages, each a folder that imports only the ones before it:

1. :mod:`.census` — what lives now: a census of live tensors, autograd graphs
   (:mod:`.census.graphs`) and large containers (:mod:`.census.containers`), diffed against the
   previous one; Python allocations by site when tracing (:mod:`.census.allocations`,
   :mod:`.census.sites`); and whose code an object is (:mod:`.census.ownership`: the user's, or
   memwatch's own, which is never counted).
2. :mod:`.growth` — what the growth is, in bytes: grown containers weighed
   (:mod:`.growth.weigh`), allocation sites weighed against host growth (:mod:`.growth.traced`),
   device tensors joined to where they were allocated (:mod:`.growth.device_sites`).
3. :mod:`.holders` — who keeps it alive: the holder walk (:mod:`.holders.holders`, one hop at a
   time in :mod:`.holders.referrers`, running frames in :mod:`.holders.frames`, names in
   :mod:`.holders.names`, the bounds a holder carries itself in :mod:`.holders.bounds`),
   and the DataLoaders that keep workers (:mod:`.holders.loaders`).
4. :mod:`.wording` — how a culprit reads in a finding (pure functions of an attribution).

:func:`.attribution.attribute` runs stages 1-3 for one metric's growth, and
:class:`.live.LiveEvidence` puts them behind the analyzer's one port
(:class:`memwatch.analysis.evidence.Evidence`).
"""

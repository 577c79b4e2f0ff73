"""Stage 1 of finding a culprit: what lives now (a census of tensors, graphs, containers and, when
tracing, Python allocations by site) and what grew since the previous census; and whose code an
object is (:mod:`.ownership`)."""

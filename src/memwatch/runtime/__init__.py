"""Layer 4, what runs beside a watched run: the flight recorder, the watchdog, the cross-rank
exchange, checkpoint state and the sink dispatcher. Each part is handed a read-only view of the
session and explicit callbacks, never the session itself (see ``docs/architecture.md``)."""

"""Layer 8, ``memwatch run``'s in-process part: watch a training script without editing it.

``memwatch run [options] -- python train.py`` (:mod:`memwatch.cli.run`) validates its options,
writes a *plan* (:mod:`memwatch.autorun.plan`: which script or module is the training script, the
:class:`memwatch.MemWatch` options) into the environment, puts :mod:`memwatch.autorun.shim` first
on ``PYTHONPATH`` and runs the command. In each process whose main script is the training script
(every rank a launcher starts), the shim loads :mod:`memwatch.autorun.controller` once torch or a
framework is imported; the controller adds the matching adapter when a Lightning or transformers
``Trainer`` is created, attaches the Accelerate hook at the first step of a prepared optimizer,
and otherwise watches the plain loop through torch's process-wide optimizer step hook.

This package sits between :mod:`memwatch.integrations` (which it imports lazily, when the script
imported the framework) and :mod:`memwatch.cli`.
"""

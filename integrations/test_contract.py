"""The contract every adapter keeps, tested once for all three (Lightning, transformers,
Accelerate) with real frameworks on CPU: construct, the same tiny fit twice, close twice, the
exception path, the state round trip, and the graceful stop with its true reason for each cause
(critical usage, an OOM forecast, a near-OOM peak).

Each adapter gets a small :class:`Harness` that builds a real training run around it; the tests
themselves know nothing of any framework.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from memwatch import MemWatchWarning
from memwatch.bundle import open_bundle
from memwatch.testing import FakeDevice

pytestmark = [
    pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*is deprecated:FutureWarning"),
]

MiB = 1 << 20
GiB = 1 << 30
STEPS = 8  # optimizer steps per epoch
OnStep = Callable[[int], None]


class Fail(MemoryError):
    """The failure the exception-path test plants (a host OOM, so a bundle is written)."""


class Harness:
    """Builds a real training run around one adapter. ``on_step(n)`` runs inside optimizer step
    ``n`` (1-based, counted over the harness's lifetime); ``fail_at`` raises :class:`Fail` there."""

    name = ""
    #: Whether a second fit continues the first one's session (else it starts a new one).
    continues = False

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.steps = 0

    def make(self, **options: Any) -> Any:
        raise NotImplementedError

    def fit(self, adapter: Any, epochs: int = 2, on_step: OnStep | None = None,
            fail_at: int | None = None) -> None:
        raise NotImplementedError

    def _step(self, on_step: OnStep | None, fail_at: int | None) -> None:
        self.steps += 1
        if on_step is not None:
            on_step(self.steps)
        if fail_at is not None and self.steps == fail_at:
            raise Fail(f"planted at step {fail_at}")


# ---------------------------------------------------------------------- Lightning
class LightningHarness(Harness):
    name = "lightning"

    def make(self, **options: Any) -> Any:
        from memwatch.integrations.lightning import MemWatchCallback

        options.setdefault("out_dir", str(self.tmp / "mw"))
        return MemWatchCallback(workers=False, log_every_n_steps=1, **options)

    def fit(self, adapter: Any, epochs: int = 2, on_step: OnStep | None = None,
            fail_at: int | None = None) -> None:
        import lightning.pytorch as L

        harness = self

        class Tiny(L.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.layer = nn.Linear(8, 1)

            def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
                harness._step(on_step, fail_at)
                return self.layer(batch[0]).pow(2).mean()  # type: ignore[no-any-return]

            def configure_optimizers(self) -> Any:
                return torch.optim.SGD(self.parameters(), lr=0.01)

        trainer = L.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False,
                            default_root_dir=str(self.tmp), callbacks=[adapter],
                            limit_val_batches=0, log_every_n_steps=1)
        trainer.fit(Tiny(), _loader())


# ---------------------------------------------------------------------- transformers
class TransformersHarness(Harness):
    name = "transformers"

    def make(self, **options: Any) -> Any:
        from memwatch.integrations.transformers import MemWatchCallback

        options.setdefault("out_dir", str(self.tmp / "mw"))
        return MemWatchCallback(workers=False, **options)

    def fit(self, adapter: Any, epochs: int = 2, on_step: OnStep | None = None,
            fail_at: int | None = None) -> None:
        from transformers import PrinterCallback, Trainer, TrainingArguments

        from memwatch.integrations.transformers import watch_trainer

        harness = self

        class Tiny(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.layer = nn.Linear(8, 1)

            def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
                if self.training:
                    harness._step(on_step, fail_at)
                return {"loss": (self.layer(x).squeeze(-1) - labels).pow(2).mean()}

        args = TrainingArguments(str(self.tmp / "hf"), use_cpu=True, num_train_epochs=epochs,
                                 per_device_train_batch_size=4, report_to=[], disable_tqdm=True,
                                 save_strategy="no", logging_steps=1000)
        data = [{"x": torch.randn(8), "labels": torch.tensor(0.0)} for _ in range(4 * STEPS)]
        trainer = Trainer(Tiny(), args, train_dataset=data, callbacks=[adapter])
        trainer.remove_callback(PrinterCallback)
        with watch_trainer(trainer, adapter):
            trainer.train()


# ---------------------------------------------------------------------- Accelerate
class AccelerateHarness(Harness):
    name = "accelerate"
    continues = True  # one hook, one session, across the loop's passes

    def make(self, **options: Any) -> Any:
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState, GradientState

        from memwatch.integrations.accelerate import attach

        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        acc = Accelerator(cpu=True)
        model = nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        self.model, self.opt, self.data = acc.prepare(model, opt, _loader())
        self.acc = acc
        options.setdefault("out_dir", str(self.tmp / "mw"))
        return attach(acc, self.opt, workers=False, **options)

    def fit(self, hook: Any, epochs: int = 2, on_step: OnStep | None = None,
            fail_at: int | None = None) -> None:
        try:
            for _ in range(epochs):
                for (x,) in self.data:
                    self._step(on_step, fail_at)
                    self.acc.backward(self.model(x).pow(2).mean())
                    self.opt.step()
                    self.opt.zero_grad()
                    if hook.should_stop:
                        return  # what a loop with graceful_stop does: save, then leave
        except BaseException as e:  # what `with attach(...) as hook:` does on the way out
            hook.__exit__(type(e), e, e.__traceback__)
            raise


def _loader() -> torch.utils.data.DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(4 * STEPS, 8, generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=4)


HARNESSES = (LightningHarness, TransformersHarness, AccelerateHarness)


@pytest.fixture(params=HARNESSES, ids=lambda h: h.name)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    h: Harness = request.param(tmp_path)
    return h


# ---------------------------------------------------------------------- the contract
def test_fit_twice_then_close_twice(harness: Harness) -> None:
    adapter = harness.make()
    if harness.continues:  # Accelerate: the loop's second pass goes on in the same session
        harness.fit(adapter, epochs=1)
        assert adapter.memwatch.step_count == STEPS
        harness.fit(adapter, epochs=1)
        assert adapter.memwatch.step_count == 2 * STEPS
        assert [e.n_steps for e in adapter.memwatch.epochs] == [STEPS, STEPS]
    else:
        harness.fit(adapter)
        first = adapter.memwatch
        assert first.step_count == 2 * STEPS and [e.n_steps for e in first.epochs] == [STEPS] * 2
        harness.fit(adapter)  # the same adapter object, a second run: a session of its own
        assert adapter.memwatch is not first and adapter.memwatch.step_count == 2 * STEPS
        assert not first.running
    adapter.close()
    adapter.close()  # idempotent
    assert not adapter.memwatch.running and adapter.memwatch.closed
    assert adapter.bundle_path is None and not adapter.stopped_by_memwatch


def test_a_failure_gets_its_bundle_and_propagates_unchanged(harness: Harness) -> None:
    adapter = harness.make()
    with pytest.raises(Fail) as info:
        harness.fit(adapter, fail_at=5)
    path = info.value.memwatch_bundle  # type: ignore[attr-defined]
    assert path is not None and adapter.bundle_path == path
    manifest = open_bundle(path).manifest
    assert manifest["classification"] == "host_oom" and manifest["trigger"] == "exception"
    assert any("memwatch: diagnostic bundle written" in n for n in info.value.__notes__)
    assert not adapter.memwatch.running  # every session closed on the way out
    adapter.close()


def test_state_round_trip(harness: Harness) -> None:
    dev = FakeDevice(total_bytes=GiB)
    adapter = harness.make(device=dev, watchdog=False)
    with warnings.catch_warnings(record=True):  # the leak's own warning
        warnings.simplefilter("always")
        harness.fit(adapter, epochs=3, on_step=lambda n: dev.set(allocated=n * 4 * MiB))
    assert [f.kind for f in adapter.findings if f.metric == "device.allocated"] == ["leak"] * 2
    state = json.loads(json.dumps(adapter.state_dict(), allow_nan=False))
    train_state = state["train"]
    assert train_state["step_count"] == 3 * STEPS and len(train_state["epochs"]) == 3
    adapter.close()
    again = harness.make(device=FakeDevice(total_bytes=GiB), watchdog=False)
    again.load_state_dict(state)
    before = json.loads(json.dumps([f.to_dict() for f in adapter.findings]))
    assert [f.to_dict() for f in again.findings] == before
    again.close()


CAUSES: dict[str, tuple[Callable[[FakeDevice, int], None], str]] = {
    # Allocated memory at 97% of the device from step 3: the watchdog's critical threshold.
    "critical": (lambda dev, n: dev.set(allocated=int((0.97 if n >= 3 else 0.1) * GiB)),
                 "device memory at 97% of its limit (critical threshold 95%)"),
    # A steady leak: the epoch-end verdict forecasts the OOM within the watchdog's horizon.
    "forecast": (lambda dev, n: dev.set(allocated=n * 16 * MiB),
                 "out of memory is forecast: leak on device.allocated"),
    # One step's peak at 92% (allocated stays low): the epoch end finds a near-OOM peak.
    "near_oom": (lambda dev, n: (dev.set(allocated=int(0.92 * GiB)) if n == 5 else None,
                                 dev.set(allocated=100 * MiB)),
                 "device.peak peaked near its limit (near_oom)"),
}


@pytest.mark.parametrize("cause", sorted(CAUSES))
def test_graceful_stop_says_why(harness: Harness, cause: str) -> None:
    script, reason = CAUSES[cause]
    dev = FakeDevice(total_bytes=GiB)
    adapter = harness.make(device=dev, graceful_stop=True,
                           watchdog={"every_n_steps": 1, "alert": lambda a: None,
                                     "on_critical": ("alert", "stop"),
                                     "on_forecast": ("alert", "stop")})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        harness.fit(adapter, epochs=4, on_step=lambda n: script(dev, n))
    stops = [str(w.message) for w in caught if issubclass(w.category, MemWatchWarning)
             and "stopping training" in str(w.message)]
    assert adapter.stopped_by_memwatch and len(stops) == 1, stops
    assert adapter.stop_reason is not None and adapter.stop_reason.startswith(reason), \
        adapter.stop_reason
    assert f"({adapter.stop_reason})" in stops[0]
    assert adapter.memwatch.step_count < 4 * STEPS  # it did stop
    adapter.close()


def renamed_hooks(adapter: type, base: type) -> list[str]:
    """The methods ``adapter`` marks ``@override`` that ``base`` (the framework's callback class)
    does not have: hooks the framework would never call."""
    return sorted(n for n, v in vars(adapter).items()
                  if getattr(v, "__override__", False) and not hasattr(base, n))


@pytest.mark.parametrize("name", ["lightning", "transformers"])
def test_every_hook_is_marked_and_is_the_frameworks(name: str) -> None:
    """mypy fails on a marked hook the framework renamed; at run time the marks say the same."""
    import importlib

    from memwatch.core.compat import override

    adapter = importlib.import_module(f"memwatch.integrations.{name}").MemWatchCallback
    base = next(b for b in adapter.__mro__[1:] if b.__module__.split(".")[0] in
                ("lightning", "pytorch_lightning", "transformers"))
    hooks = {n for n, v in vars(adapter).items() if n.startswith(("on_", "setup", "teardown"))
             and callable(v)}
    assert hooks and all(getattr(vars(adapter)[n], "__override__", False) for n in hooks), hooks
    assert renamed_hooks(adapter, base) == []

    class Renamed(adapter):  # type: ignore[misc, valid-type]
        @override
        def on_train_epoch_endd(self) -> None: ...

    assert renamed_hooks(Renamed, base) == ["on_train_epoch_endd"]

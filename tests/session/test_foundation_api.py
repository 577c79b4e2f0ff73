"""The public surface of ``memwatch``: names, lazy torch, configuration errors."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import memwatch
from memwatch import ConfigError, MemWatch
from memwatch.core.errors import MemwatchError
from memwatch.testing import FakeDevice


def test_all_is_sorted_and_every_name_imports() -> None:
    assert memwatch.__all__ == sorted(memwatch.__all__)
    assert len(set(memwatch.__all__)) == len(memwatch.__all__)
    fresh = importlib.import_module("memwatch")
    for name in memwatch.__all__:
        assert getattr(fresh, name) is not None, name


def test_public_names_are_the_documented_ones() -> None:
    for name in ("watch", "MemWatch", "Finding", "ConfigError", "MemwatchError", "__version__"):
        assert name in memwatch.__all__, name
    assert isinstance(memwatch.__version__, str) and memwatch.__version__[0].isdigit()


def test_config_error_is_a_value_error_and_a_memwatch_error() -> None:
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ConfigError, MemwatchError)


def test_import_memwatch_does_not_import_torch(run_python) -> None:  # type: ignore[no-untyped-def]
    proc = run_python(
        """
        import sys
        import memwatch, memwatch.testing, memwatch.timeline, memwatch.timeline.sampler
        import memwatch.probes.host, memwatch.probes.workers
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if "torch" in m)
        print("ok")
        """
    )
    assert proc.stdout.strip() == "ok"


def test_import_and_watch_work_with_torch_blocked(run_python, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = run_python(
        f"""
        try:
            import torch
        except ImportError:
            pass
        else:
            raise AssertionError("the blocker did not block torch")
        import memwatch
        from memwatch.testing import FakeDevice
        dev = FakeDevice(total_bytes=2**30)
        with memwatch.watch(device=dev, workers=False, out_dir={str(tmp_path)!r}) as mw:
            dev.set(allocated=2**20)
            mw.step()
        # device=None without torch: no accelerator, host metrics only.
        with memwatch.watch(device=None, out_dir={str(tmp_path)!r}) as mw2:
            mw2.step()
        assert mw2.device is None and "host.rss" in mw2.latest()
        print(mw.latest()["device.allocated"])
        """,
        block_torch=True,
    )
    assert float(proc.stdout.strip()) == 2**20


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"device": "cuda:x"}, "device"),
        ({"device": "tpu"}, "device"),
        ({"device": "mps:1"}, "device"),
        ({"device": "cpu:0"}, "device"),
        ({"device": 3}, "device"),
        ({"device": object()}, "device"),
        ({"interval_s": 0}, "interval_s"),
        ({"interval_s": -1.0}, "interval_s"),
        ({"interval_s": float("inf")}, "interval_s"),
        ({"interval_s": "1"}, "interval_s"),
        ({"interval_s": True}, "interval_s"),
        ({"capacity": 8}, "capacity"),
        ({"capacity": 100.0}, "capacity"),
        ({"buckets_per_epoch": 7}, "buckets_per_epoch"),
        ({"buckets_per_epoch": 2}, "buckets_per_epoch"),
        ({"census": "sometimes"}, "census"),
        ({"total_steps": 0}, "total_steps"),
        ({"out_dir": ""}, "out_dir"),
    ],
)
def test_bad_configuration_raises_config_error_naming_the_option(
    kwargs: dict[str, object], option: str
) -> None:
    with pytest.raises(ConfigError) as info:
        MemWatch(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert f"{option}=" in str(info.value)


def test_bad_device_message_lists_accepted_values() -> None:
    with pytest.raises(ConfigError, match=r"'cuda:N'.*'mps'.*FakeDevice"):
        MemWatch(device="tpu")


@pytest.mark.parametrize("device", [None, "auto", "cpu", "cuda", "cuda:0", "CUDA:1", "mps"])
def test_valid_device_strings_construct(device: str | None) -> None:
    MemWatch(device=device)  # validation only; nothing is opened before start()


def test_torch_device_object_is_accepted(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    mw = MemWatch(device=torch.device("cpu"), workers=False, out_dir=tmp_path)
    with mw:
        mw.step()
        assert mw.device is None
    with pytest.raises(ConfigError):
        MemWatch(device=torch.device("meta"))


def test_cuda_on_a_machine_without_cuda_fails_clearly_at_start(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the error path needs a CPU-only machine")
    mw = MemWatch(device="cuda", out_dir=tmp_path)  # construction only validates the string
    with pytest.raises(ConfigError) as info:
        mw.start()
    msg = str(info.value)
    assert "device='cuda'" in msg and "not usable" in msg and "device='cpu'" in msg
    assert not mw.running
    mw.close()  # closing a session that never started is fine


def test_closed_session_cannot_restart(tmp_path: Path) -> None:
    mw = MemWatch(device="cpu", workers=False, out_dir=tmp_path)
    mw.start()
    mw.close()
    with pytest.raises(ConfigError, match="closed"):
        mw.start()


def test_fake_device_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        FakeDevice(total_bytes=0)
    dev = FakeDevice(total_bytes=2**20)
    with pytest.raises(ValueError):
        dev.malloc(0)
    with pytest.raises(ValueError):
        dev.set(allocated=-1)
    with pytest.raises(ValueError, match="unknown or already freed"):
        dev.free(12345)

"""Probes: where samples come from. torch-dependent probes import torch lazily."""

from memwatch.probes.base import DEVICE_FAST_KEYS, DEVICE_SLOW_KEYS, DeviceProbe, Probe

__all__ = ["DEVICE_FAST_KEYS", "DEVICE_SLOW_KEYS", "DeviceProbe", "Probe"]

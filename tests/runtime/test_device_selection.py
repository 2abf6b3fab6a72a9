"""Device registry and selection: defaults, PYKERNEL_DEVICE, errors; never crashes without a
GPU driver."""
import numpy as np
import pytest

from pykernel.runtime import arrays as ar
from pykernel.runtime import device as dv
from tests.runtime.fakes import FakeHostDevice


@pytest.fixture
def clean_registry(monkeypatch):
    """Selection state isolated per test (restored afterwards), with a fake "cpu" kind."""
    monkeypatch.setattr(dv, "_factories", dict(dv._factories))
    monkeypatch.setattr(dv, "_instances", {})
    monkeypatch.setattr(dv, "_current", None)
    created = []

    def factory(ordinal):
        created.append(ordinal)
        return FakeHostDevice()
    dv.register_device_kind("cpu", factory)
    return created


def test_gpu_available_is_a_bool_and_cached():
    first = dv.gpu_available()
    assert isinstance(first, bool) and dv.gpu_available() is first


def test_env_variable_overrides_default(clean_registry, monkeypatch):
    monkeypatch.setenv("PYKERNEL_DEVICE", "cpu")
    device = dv.current_device()
    assert device.kind == "cpu" and dv.current_device() is device
    assert clean_registry == [0]


def test_default_without_gpu_is_cpu(clean_registry, monkeypatch):
    monkeypatch.delenv("PYKERNEL_DEVICE", raising=False)
    monkeypatch.setattr(dv, "_gpu_usable", False)
    assert dv.default_device_spec() == "cpu" and dv.current_device().kind == "cpu"
    monkeypatch.setattr(dv, "_gpu_usable", True)
    assert dv.default_device_spec() == "cuda"


def test_set_device_and_arrays_follow_it(clean_registry):
    device = dv.set_device("cpu")
    assert dv.current_device() is device and dv.get_device("cpu:0") is device
    assert dv.get_device("cpu:1") is not device
    x = ar.to_device(np.arange(3, dtype=np.float32))
    assert x.device is device
    other = FakeHostDevice()
    assert dv.set_device(other) is other and ar.zeros(2).device is other


def test_bad_specs_are_explained(clean_registry, monkeypatch):
    with pytest.raises(ValueError, match="unknown device 'tpu'.*cpu.*cuda"):
        dv.set_device("tpu")
    with pytest.raises(ValueError, match="ordinal"):
        dv.set_device("cpu:x")
    monkeypatch.setattr(dv, "_gpu_usable", False)
    with pytest.raises(RuntimeError, match="no usable CUDA GPU"):
        dv.set_device("cuda")

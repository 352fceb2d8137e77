"""?backend=auto|webgpu|cpu: auto takes the numpy path on software adapters, WebGPU on real GPUs."""
import pytest

from pagedkv.backends.choice import choose_backend


@pytest.mark.parametrize("name,fallback,signs", [
    ("google / swiftshader / SwiftShader device (Subzero)", True, "isFallbackAdapter, swiftshader"),
    ("mesa / llvmpipe", False, "llvmpipe"),
    ("mesa / lavapipe", False, "lavapipe"),
    ("some / adapter", True, "isFallbackAdapter"),
])
def test_auto_takes_the_numpy_path_on_a_software_adapter(name, fallback, signs):
    assert choose_backend("auto", name, fallback) == (
        "cpu", f"auto: {name} is a software adapter ({signs}): numpy in the tab decodes faster there")


def test_auto_keeps_webgpu_on_a_hardware_adapter():
    assert choose_backend("auto", "nvidia / ampere / NVIDIA RTX 3060", False) == (
        "webgpu", "auto: nvidia / ampere / NVIDIA RTX 3060 is a hardware adapter")


@pytest.mark.parametrize("asked", ["webgpu", "cpu"])
def test_an_explicit_backend_overrides_the_rule(asked):
    assert choose_backend(asked, "google / swiftshader", True) == (asked, f"backend={asked} was asked for")
    assert choose_backend(asked, "nvidia / ampere", False) == (asked, f"backend={asked} was asked for")


def test_an_unknown_backend_is_refused_by_name():
    with pytest.raises(ValueError, match=r"backend must be auto, webgpu or cpu, got 'gpu'"):
        choose_backend("gpu", "nvidia / ampere", False)

"""Every composed kernel variant (backends/webgpu/shader_variants.py) compiles on wgpu-py (naga), with its
pipeline constants at their defaults; the kernel tests check what the ones in use compute."""
from pagedkv.backends.webgpu.shader_variants import VARIANTS

FEATURE_OF = {"enable subgroups;": "subgroups", "enable f16;": "shader-f16"}


def test_every_variant_compiles(native_loop, native_device):
    features = set(native_device.info.features)
    names = [name for name, v in VARIANTS.items() if all(FEATURE_OF[line] in features for line in v.enables)]
    # (lavapipe has both features: there that is all 58)

    async def compile_all():
        return [await native_device.kernel(name) for name in names]

    assert all(pipeline is not None for pipeline in native_loop.run(compile_all()))

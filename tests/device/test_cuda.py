"""CudaDevice: Keras (torch backend) on a CUDA GPU. The GPU tests skip cleanly without one."""

import pytest

from leti.errors import DeviceError


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


needs_gpu = pytest.mark.skipif(not _has_cuda(), reason="no CUDA GPU")


@pytest.mark.skipif(_has_cuda(), reason="checks the message on machines without a GPU")
def test_without_a_gpu_the_error_is_one_clear_line():
    from leti.device.cuda import CudaDevice

    with pytest.raises(DeviceError, match="no CUDA GPU is visible to torch"):
        CudaDevice()


@pytest.fixture(scope="module")
def keras_models(tmp_path_factory):
    """Two .keras files (saved with the TF backend, loaded by the torch-backend worker)."""
    import keras

    root = tmp_path_factory.mktemp("keras")
    paths = []
    for ch in (8, 64):
        inp = keras.Input((32, 32, 3), batch_size=1)
        x = keras.layers.Conv2D(ch, 3, padding="same", activation="relu")(inp)
        x = keras.layers.Conv2D(ch, 3, padding="same", activation="relu")(x)
        m = keras.Model(inp, keras.layers.GlobalAveragePooling2D()(x))
        p = root / f"c{ch}.keras"
        m.save(p)
        paths.append(p)
        keras.backend.clear_session()
    return paths


@pytest.mark.gpu
@needs_gpu
def test_cuda_measures_keras_models_with_synchronisation(keras_models):
    from leti.device.base import Protocol, measure
    from leti.device.cuda import CudaDevice

    with CudaDevice() as dev:
        assert dev.info()["kind"] == "cuda" and dev.tool_versions()["keras_backend"] == "torch"
        small = measure(dev, keras_models[0], Protocol(runs=50, warmup=10, max_rel_std=10))
        big = measure(dev, keras_models[1], Protocol(runs=50, warmup=10, max_rel_std=10))
        assert small.runs == big.runs == 50 and small.delegation == "cuda"
        assert 0 < small.min_ms <= small.median_ms <= small.max_ms
        assert small.mem_peak_mb > 0


@pytest.mark.gpu
@needs_gpu
def test_cuda_broken_model_is_a_corrupt_model(tmp_path):
    from leti.device.cuda import CudaDevice
    from leti.errors import CorruptModelError

    bad = tmp_path / "bad.keras"
    bad.write_bytes(b"no zip here")
    with CudaDevice() as dev, pytest.raises(CorruptModelError, match="cannot load bad.keras"):
        dev.run(bad, 5, 1)

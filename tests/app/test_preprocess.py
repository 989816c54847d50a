"""Image-folder preprocessing: explicit size and statistics, torchvision presets, the upscaling warning, bad options."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from minreal.app.callables import SpecError
from minreal.app.cli import run
from minreal.app.data import load_data, load_dataset
from minreal.app.preprocess import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImagePreprocess,
    parse_channel_stats,
    parse_image_size,
    preprocess_from_options,
    weights_preprocess,
)

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)  # CIFAR-10's
CIFAR_NET = """
from torch import nn

def make():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 2))
"""


def _write_folder(root: Path, size: tuple[int, int] = (32, 32), per_class: int = 3) -> np.ndarray:
    """Two classes of random RGB PNGs of ``size`` (width, height); returns the pixels in ImageFolder's order."""
    from PIL import Image

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(2 * per_class, size[1], size[0], 3), dtype=np.uint8)
    for i, image in enumerate(pixels):
        folder = root / f"class_{i // per_class}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{i}.png")
    return pixels


def test_image_size_and_statistics_give_exactly_normalised_pixels(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    pixels = _write_folder(tmp_path / "imgs")
    prep = preprocess_from_options("32", ",".join(map(str, MEAN)), ",".join(map(str, STD)))
    with caplog.at_level(logging.WARNING):
        data = load_dataset(str(tmp_path / "imgs"), preprocess=prep)
    assert data.x.shape == (6, 3, 32, 32) and data.y.tolist() == [0, 0, 0, 1, 1, 1]
    manual = (pixels.transpose(0, 3, 1, 2) / 255.0 - np.array(MEAN)[:, None, None]) / np.array(STD)[:, None, None]
    assert np.allclose(data.x.numpy(), manual, atol=1e-5)  # no resampling at the images' own size
    assert not caplog.records  # the size was chosen: no upscaling warning


def test_non_square_size_is_height_by_width(tmp_path: Path) -> None:
    _write_folder(tmp_path / "imgs", size=(40, 30))  # PIL sizes are (width, height)
    data = load_dataset(str(tmp_path / "imgs"), preprocess=preprocess_from_options("24x32"))
    assert data.x.shape == (6, 3, 24, 32)


def test_torchvision_weights_entry_gives_its_preset(tmp_path: Path) -> None:
    from PIL import Image
    from torchvision.models import ResNet18_Weights

    prep = weights_preprocess("ResNet18_Weights.IMAGENET1K_V1")
    assert (prep.size, prep.resize, prep.mean, prep.std) == ((224, 224), 256, IMAGENET_MEAN, IMAGENET_STD)
    assert prep.source == "ResNet18_Weights.IMAGENET1K_V1" and prep.interpolation == "bilinear"
    vit = weights_preprocess("ViT_B_16_Weights.IMAGENET1K_SWAG_E2E_V1")
    assert (vit.size, vit.resize, vit.interpolation) == ((384, 384), 384, "bicubic")
    pixels = _write_folder(tmp_path / "imgs", size=(300, 260), per_class=1)
    data = load_dataset(str(tmp_path / "imgs"), preprocess=prep)
    reference = ResNet18_Weights.IMAGENET1K_V1.transforms()(Image.fromarray(pixels[0]))
    assert data.x.shape == (2, 3, 224, 224) and torch.allclose(data.x[0], reference, atol=1e-5)


def test_default_warns_when_small_images_are_upscaled(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _write_folder(tmp_path / "small")
    with caplog.at_level(logging.WARNING):
        data = load_data(str(tmp_path / "small"), eval_fraction=0.0)
    assert data.calib.x.shape == (6, 3, 224, 224)  # the default is kept
    (record,) = caplog.records
    assert "all 32x32" in record.message and "upscaled to 224x224" in record.message
    assert "--image-size 32" in record.message
    caplog.clear()
    _write_folder(tmp_path / "large", size=(160, 120))  # short side 120 > 224 / 2: not warned
    with caplog.at_level(logging.WARNING):
        load_dataset(str(tmp_path / "large"))
    assert not caplog.records


@pytest.mark.parametrize("call, pattern", [
    (lambda: parse_image_size("0"), r"--image-size expects a positive integer N or HxW.*got '0'"),
    (lambda: parse_image_size("32x"), r"--image-size expects"),
    (lambda: parse_image_size("big"), r"--image-size expects"),
    (lambda: parse_channel_stats("0.5,0.5", "--mean"), r"--mean expects 3 comma-separated numbers"),
    (lambda: parse_channel_stats("0.5,0.5,nan", "--mean"), r"--mean expects 3"),
    (lambda: parse_channel_stats("0.2,0,0.2", "--std"), r"--std values must be positive"),
    (lambda: weights_preprocess("ResNet18_Weights.IMAGENET1K"), r"did you mean ResNet18_Weights\.IMAGENET1K_V1"),
    (lambda: weights_preprocess("FasterRCNN_ResNet50_FPN_Weights.DEFAULT"), r"ObjectDetection preset, not image"),
    (lambda: preprocess_from_options("32", weights="ResNet18_Weights.DEFAULT"), r"drop --image-size"),
    (lambda: ImagePreprocess(std=(0.1, -0.1, 0.1)), r"std must be positive"),
    (lambda: ImagePreprocess(interpolation="lanczos"), r"interpolation must be one of"),
])
def test_bad_values_are_one_line_spec_errors(call, pattern: str) -> None:
    with pytest.raises(SpecError, match=pattern) as info:
        call()
    assert "\n" not in str(info.value)


@pytest.fixture
def cifar_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "net.py").write_text(CIFAR_NET)
    _write_folder(tmp_path / "imgs")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("extra, culprit", [
    (["--mean", "0.5,0.5"], "--mean expects 3"),
    (["--std", "0.2,0,0.2"], "--std values must be positive"),
    (["--mean", "125.3,123,113.9"], "--mean is on [0, 1] pixels"),
    (["--image-size", "-3"], "--image-size expects"),
    (["--preprocess", "Resnet18_Weights.IMAGENET1K_V1"], "did you mean ResNet18_Weights.IMAGENET1K_V1"),
    (["--preprocess", "ResNet18_Weights.DEFAULT", "--std", "1,1,1"], "drop --std"),
])
def test_cli_bad_options_are_one_line_usage_errors(cifar_dir: Path, capsys: pytest.CaptureFixture,
                                                   extra: list[str], culprit: str) -> None:
    code = run(["export", "net.py:make", "--out", "m.onnx", "--data", "imgs", *extra])
    err = capsys.readouterr().err
    assert code == 2 and culprit in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not Path("m.onnx").exists()


def test_cli_refuses_image_options_for_data_that_is_not_an_image_folder(cifar_dir: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    code = run(["compress", "net.py:make", "-m", "svd", "--data", "digits32", "--image-size", "32"])
    err = capsys.readouterr().err
    assert code == 2 and "apply to image folders, and data digits32 is not one" in err


def test_cli_export_uses_the_image_size(cifar_dir: Path, capsys: pytest.CaptureFixture) -> None:
    code = run(["export", "net.py:make", "--out", "m.onnx", "--data", "imgs", "--image-size", "32", "--mean",
                ",".join(map(str, MEAN)), "--std", ",".join(map(str, STD)), "-q"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "upscaled" not in captured.err
    import onnx

    dims = [d.dim_value for d in onnx.load("m.onnx").graph.input[0].type.tensor_type.shape.dim[1:]]
    assert dims == [3, 32, 32]


def test_cli_bench_takes_the_image_size_of_its_data(cifar_dir: Path, capsys: pytest.CaptureFixture) -> None:
    """bench evaluates on an image folder with the model's own preprocessing (a 32x32 model cannot take 224)."""
    stats = ["--image-size", "32", "--mean", ",".join(map(str, MEAN)), "--std", ",".join(map(str, STD))]
    assert run(["export", "net.py:make", "--out", "m.onnx", "--data", "imgs", *stats, "-q"]) == 0
    code = run(["bench", "m.onnx", "--data", "imgs", *stats, "--min-seconds", "0.01", "--repeats", "1",
                "--min-runs", "2", "--out", "b.json", "-q"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    import json

    metrics = json.loads(Path("b.json").read_text())["metrics"]
    assert metrics[0]["samples"] == 6 and metrics[0]["accuracy"] is not None
    assert run(["bench", "m.onnx", "--data", "digits", "--image-size", "32", "--out", "c.json"]) == 2
    assert "apply to image folders" in capsys.readouterr().err and not Path("c.json").exists()

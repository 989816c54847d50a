"""How an image folder becomes model inputs: resize, centre crop, scale to [0, 1], normalise per channel.

:class:`ImagePreprocess` is torchvision's image-classification preset as a typed value (the short side resized to
``resize``, a centre crop of ``size``, ``ToTensor``, ``Normalize(mean, std)``). It comes from the defaults (224×224,
ImageNet statistics), from explicit values (``--image-size``, ``--mean``, ``--std``) or from a torchvision weights
entry (``--preprocess ResNet18_Weights.IMAGENET1K_V1``: that entry's ``transforms()``, read without downloading
anything). Every bad value is a one-line :class:`~minreal.app.callables.SpecError` naming the option.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minreal.app.callables import SpecError

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "INTERPOLATIONS", "ImagePreprocess", "parse_channel_stats",
           "parse_image_size", "preprocess_from_options", "weights_preprocess"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INTERPOLATIONS = ("nearest", "bilinear", "bicubic")
DEFAULT_SOURCE = "default"
"""``ImagePreprocess.source`` when nobody chose the preprocessing (image folders then warn about upscaling)."""


@dataclass(frozen=True)
class ImagePreprocess:
    """Resize the short side to ``resize`` (None: the crop's larger side), centre-crop to ``size`` (height,
    width), scale to [0, 1] and normalise each RGB channel as ``(x - mean) / std``.

    Attributes
    ----------
    size : tuple[int, int]
        the crop, ``(height, width)``; the model's input is ``(3, *size)``.
    resize : int | None
        short side before the crop (torchvision presets: 256 for a 224 crop); None resizes to the
        crop's larger side, so an image already of that size is left as it is.
    mean, std : tuple[float, float, float]
        per-channel statistics (R, G, B) of the data the model was trained on.
    interpolation : str
        ``nearest``, ``bilinear`` or ``bicubic`` (of the resize).
    source : str
        where these values came from (``default``, ``options``, or a weights entry's name).
    """

    size: tuple[int, int] = (224, 224)
    resize: int | None = None
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    interpolation: str = "bilinear"
    source: str = DEFAULT_SOURCE

    def __post_init__(self) -> None:
        if len(self.size) != 2 or min(self.size) < 1:
            raise SpecError(f"image size must be two positive integers (height, width), got {self.size}")
        if self.resize is not None and self.resize < 1:
            raise SpecError(f"resize size must be a positive integer, got {self.resize}")
        for name, stats in (("mean", self.mean), ("std", self.std)):
            if len(stats) != 3 or not all(math.isfinite(v) for v in stats):
                raise SpecError(f"{name} must be 3 finite numbers (R, G, B), got {stats}")
        if min(self.std) <= 0:
            raise SpecError(f"std must be positive for every channel, got {self.std}")
        if self.interpolation not in INTERPOLATIONS:
            raise SpecError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got {self.interpolation!r}")

    @property
    def resize_to(self) -> int:
        """The short side images are resized to before the crop."""
        return self.resize if self.resize is not None else max(self.size)

    def transform(self) -> Callable[[Any], Any]:
        """The torchvision transform: PIL image → float tensor ``(3, *size)``."""
        from torchvision import transforms

        mode = transforms.InterpolationMode(self.interpolation)
        return transforms.Compose([transforms.Resize(self.resize_to, interpolation=mode),
                                   transforms.CenterCrop(self.size), transforms.ToTensor(),
                                   transforms.Normalize(self.mean, self.std)])

    def describe(self) -> str:
        """One line, e.g. ``224x224 crop of short side 256 (bilinear), mean (...), std (...) [source]``."""
        h, w = self.size
        stats = ", ".join(f"{n} ({', '.join(f'{v:g}' for v in s)})" for n, s in (("mean", self.mean),
                                                                               ("std", self.std)))
        return f"{h}x{w} crop of short side {self.resize_to} ({self.interpolation}), {stats} [{self.source}]"


def parse_image_size(text: str, flag: str = "--image-size") -> tuple[int, int]:
    """``"32"`` → ``(32, 32)``; ``"24x32"`` → ``(24, 32)`` (height x width)."""
    parts = text.lower().replace("×", "x").split("x")
    try:
        values = tuple(int(p.strip()) for p in parts)
    except ValueError:
        values = ()
    if len(values) not in (1, 2) or min(values, default=0) < 1:
        raise SpecError(f"{flag} expects a positive integer N or HxW (height x width), e.g. 32 or 24x32; "
                        f"got {text!r}")
    return (values[0], values[-1])


def parse_channel_stats(text: str, flag: str) -> tuple[float, float, float]:
    """``"0.49,0.48,0.45"`` → three finite floats (R, G, B); ``--std`` values must be positive."""
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if len(values) != 3 or not all(math.isfinite(v) for v in values):
        raise SpecError(f"{flag} expects 3 comma-separated numbers (R,G,B), e.g. 0.4914,0.4822,0.4465; got {text!r}")
    if flag == "--std" and min(values) <= 0:
        raise SpecError(f"{flag} values must be positive (they divide), got {text!r}")
    if max(abs(v) for v in values) > 1.0:
        raise SpecError(f"{flag} is on [0, 1] pixels (images are scaled by 1/255 first), got {text!r}; divide "
                        f"0-255 statistics by 255, e.g. {','.join(f'{v / 255:.4g}' for v in values)}")
    return values  # type: ignore[return-value]


def _weights_entries() -> list[str]:
    """Every torchvision weights entry as ``Enum.MEMBER`` (from the installed torchvision, nothing downloaded)."""
    from torchvision.models import get_model_weights, list_models

    return sorted({f"{e.__name__}.{m}" for n in list_models() for e in [get_model_weights(n)] for m in e.__members__})


def weights_preprocess(entry: str) -> ImagePreprocess:
    """The preprocessing of torchvision weights ``entry`` (e.g. ``ResNet18_Weights.IMAGENET1K_V1``): its
    ``transforms()`` preset's crop, resize, mean, std and interpolation; the weights are not downloaded.

    Raises
    ------
    SpecError
        unknown entry (with close matches), or an entry whose preset is not image classification.
    """
    from torchvision.models import get_weight
    from torchvision.transforms._presets import ImageClassification

    try:
        weights = get_weight(entry.strip())
    except (KeyError, ValueError, AttributeError):
        close = difflib.get_close_matches(entry.strip(), _weights_entries(), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise SpecError(f"--preprocess: unknown torchvision weights entry {entry!r}; {hint}give Enum.ENTRY as in "
                        "torchvision.models, e.g. ResNet18_Weights.IMAGENET1K_V1") from None
    preset = weights.transforms()
    if not isinstance(preset, ImageClassification):
        raise SpecError(f"--preprocess: {entry} has a {type(preset).__name__} preset, not image classification; "
                        "give --image-size/--mean/--std instead")
    crop, resize = preset.crop_size, preset.resize_size
    mean, std = tuple(preset.mean), tuple(preset.std)
    return ImagePreprocess(size=(crop[0], crop[-1]), resize=resize[0], mean=mean, std=std,  # type: ignore[arg-type]
                           interpolation=preset.interpolation.value, source=str(weights))


def preprocess_from_options(image_size: str | None = None, mean: str | None = None, std: str | None = None,
                            weights: str | None = None) -> ImagePreprocess | None:
    """The preprocessing the command-line options ask for, or None when none was given (the defaults apply).

    ``--preprocess WEIGHTS`` takes everything from the weights entry and combines with none of the others;
    ``--image-size``, ``--mean`` and ``--std`` each replace one default (224, ImageNet statistics).
    """
    if weights is not None:
        given = [f for f, v in (("--image-size", image_size), ("--mean", mean), ("--std", std)) if v is not None]
        if given:
            raise SpecError(f"--preprocess {weights} sets the size and statistics; drop {', '.join(given)} or give "
                            "--image-size/--mean/--std without --preprocess")
        return weights_preprocess(weights)
    if image_size is None and mean is None and std is None:
        return None
    return ImagePreprocess(size=parse_image_size(image_size) if image_size is not None else (224, 224),
                           mean=parse_channel_stats(mean, "--mean") if mean is not None else IMAGENET_MEAN,
                           std=parse_channel_stats(std, "--std") if std is not None else IMAGENET_STD,
                           source="options")

"""Decoding an image file or a container's record to RGB, the one way every loader and pipeline
does (16-bit greyscale scaled, CMYK and palette converted), and the error that names a corrupt one."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
from PIL import Image

from vitbench.errors import UserError


class CorruptImage(UserError):
    def __init__(self, path: str | Path, reason: object):
        super().__init__(f"{path}: corrupt or truncated image ({reason}); --skip-corrupt skips such files")
        self.path = path
        self.reason = reason


HIGH_BIT_DEPTH = {"I;16": 16, "I;16L": 16, "I;16B": 16, "I;16N": 16, "I": 32, "F": 32}


def to_uint8(pixels: np.ndarray, mode: str) -> np.ndarray:
    """A 16-bit (or 32-bit integer / float) greyscale image scaled to 8 bits by its bit depth, as
    an image viewer shows it (16-bit PNGs: value / 257); 32-bit modes hold 16-bit data in practice
    (PNG, TIFF), so values above 65535 are clipped."""
    if HIGH_BIT_DEPTH.get(mode, 16) == 32 and pixels.dtype.kind == "f" and pixels.max(initial=0) <= 1.0:
        return np.round(np.clip(pixels, 0, 1) * 255).astype(np.uint8)  # float images in 0..1
    return np.round(np.clip(pixels.astype(np.float64), 0, 65535) / 257).astype(np.uint8)


def decode(path: str | Path, data: bytes | None = None) -> Image.Image:
    """The image as RGB (greyscale, CMYK and palette images converted), or a CorruptImage naming it.
    `data`: the encoded image itself (a container's record), `path` then only names it."""
    try:
        with warnings.catch_warnings():
            # an image above Pillow's pixel limit is skipped like one above twice it (an error there):
            # its DecompressionBombWarning reached the terminal raw, and the image was decoded
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path if data is None else io.BytesIO(data)) as img:
                if img.mode in HIGH_BIT_DEPTH:  # PIL's convert("RGB") clips 16-bit values at 255 (white)
                    return Image.fromarray(to_uint8(np.asarray(img), img.mode)).convert("RGB")
                return img.convert("RGB")
    except FileNotFoundError:
        raise UserError(f"{path}: image file is missing") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise CorruptImage(path, e) from None

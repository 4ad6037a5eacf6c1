"""Mosaic's colour jitter, two ways (``augment.colour``).

Both take one draw of three numbers u in [-1, 1) from the sample's own generator, so that the
rest of a sample's stream (its flip) is the same under either, and neither depends on the worker.

``matrix``: one 3x3 linear map of RGB per sample, applied by one ``cv2.transform`` on the uint8
image (saturating). The map rotates the chroma about the grey axis in YIQ space by the hue angle,
scales the chroma by the saturation gain and the whole by the value gain:

    M = value * T^-1 @ [[1, 0, 0], [0, s cos h, -s sin h], [0, s sin h, s cos h]] @ T

with T the RGB -> YIQ matrix. Grey stays grey under any hue or saturation, and a gain of 1
with no rotation is the identity. About 10x cheaper on a 640 px image than two colour-space
conversions.

``hsv``: additive shifts of hue, saturation and value in OpenCV's HSV, as mosaic jittered
before ``matrix`` (the streams of that time, and their frozen digests, come back under it).
"""

from __future__ import annotations

import math

import cv2
import numpy as np

# RGB -> YIQ (NTSC 1953): Y the luma, I and Q the two chroma axes.
_RGB_TO_YIQ = np.array(
    [[0.299, 0.587, 0.114], [0.595716, -0.274453, -0.321263], [0.211456, -0.522591, 0.311135]], np.float64
)
_YIQ_TO_RGB = np.linalg.inv(_RGB_TO_YIQ)


def colour_matrix(hue_deg: float, saturation: float, value: float) -> np.ndarray:
    """The 3x3 float32 RGB map that rotates hue by ``hue_deg`` degrees and multiplies chroma by
    ``saturation`` and everything by ``value``."""
    c, s = math.cos(math.radians(hue_deg)), math.sin(math.radians(hue_deg))
    chroma = np.array([[1.0, 0.0, 0.0], [0.0, saturation * c, -saturation * s], [0.0, saturation * s, saturation * c]])
    return (value * _YIQ_TO_RGB @ chroma @ _RGB_TO_YIQ).astype(np.float32)


def _gain(u: float, span: tuple[float, float]) -> float:
    """u in [-1, 1) onto [low, high) linearly."""
    low, high = span
    return low + (u + 1.0) / 2.0 * (high - low)


def jitter_matrix(
    image: np.ndarray, u: np.ndarray, hue_deg: float, saturation: tuple[float, float], value: tuple[float, float]
) -> None:
    """``matrix``: hue rotated by u[0] * hue_deg degrees, saturation and value gains drawn
    uniformly in their [low, high] ranges from u[1], u[2]; in place on an HxWx3 uint8 image."""
    m = colour_matrix(float(u[0]) * hue_deg, _gain(float(u[1]), saturation), _gain(float(u[2]), value))
    cv2.transform(image, m, dst=image)


def jitter_hsv(image: np.ndarray, u: np.ndarray, limits: tuple[float, float, float]) -> None:
    """``hsv``: additive hue/saturation/value shifts of u * limits, in place.

    ``limits`` are hue in OpenCV's 0-179 units, saturation and value in 0-255 units. Hue is
    shifted in OpenCV's full-range HSV (0-255 for a whole turn), where uint8 wrap-around *is*
    the hue circle: one strided add, no modulo. Saturation and value take one saturating
    ``cv2.add``.
    """
    shifts = u * np.array(limits, np.float64)
    dh = int(round(shifts[0] * 256 / 180))
    ds, dv = int(round(shifts[1])), int(round(shifts[2]))
    if not (dh or ds or dv):
        return
    hsv = cv2.cvtColor(image, cv2.COLOR_RGB2HSV_FULL)
    if dh:
        hue = hsv.reshape(-1, 3)[:, 0]
        np.add(hue, np.uint8(dh % 256), out=hue)  # uint8 arithmetic wraps: the hue circle
    if ds or dv:
        cv2.add(hsv, (0, ds, dv, 0), dst=hsv)
    cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB_FULL, dst=image)

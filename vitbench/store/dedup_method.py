"""The near-duplicate search's settings (`vitbench dedup`), apart from the search itself so that
the views can name the default audit without loading torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

THUMB = 32  # the thumbnail every image is compared at


@dataclass(frozen=True)
class Method:
    """The search's settings: stored with every audit, part of its key."""

    threshold: float = 0.77  # verified correlation at or above which a pair is a near-duplicate
    candidates: int = 8  # audited images verified per test image and block
    candidate_cosine: float = 0.5  # the descriptors' cosine below which no pair is verified
    max_shift: int = 3  # pixels (of 32) the verification shifts by, each way
    scales: tuple[float, ...] = (0.9, 1.0, 1.1)  # the candidate's rescalings the verification tries
    version: str = "1"  # bumped when the same settings give other pairs

    def describe(self) -> dict:
        return {"name": "thumbnail-ncc", **asdict(self), "scales": list(self.scales)}

    def threshold_for(self, sides: torch.Tensor) -> torch.Tensor:
        """The correlation a pair must reach, by the shorter side (pixels) of its smaller image:
        `threshold` from 32 px on; closer to 1 in proportion below (an 8 px image: 1 - 0.23 / 4),
        since a thumbnail upscaled from fewer pixels correlates more easily: different digits of
        scikit-learn's 8 x 8 set reached 0.77-0.81, where copies of a 32 px photo start at 0.78."""
        fraction = (sides.float() / THUMB).clamp(max=1.0)
        return 1.0 - (1.0 - self.threshold) * fraction

    @classmethod
    def described(cls, description: dict) -> Method:
        """The Method `describe()` wrote (a run's hparams)."""
        return cls(
            threshold=float(description["threshold"]),
            candidates=int(description["candidates"]),
            candidate_cosine=float(description["candidate_cosine"]),
            max_shift=int(description["max_shift"]),
            scales=tuple(float(x) for x in description["scales"]),
            version=str(description["version"]),
        )

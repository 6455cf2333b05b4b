"""Thresholds of the health verdicts, with the user's overrides from `Options.thresholds`."""

from __future__ import annotations

from inspector.context import Options
from inspector.health.stats import DEAD_MIN_SAMPLES

__all__ = ["DEFAULTS", "GRADIENT_KEYS", "resolve"]

DEFAULTS: dict[str, float] = {
    # A layer whose gradient per element (RMS) is this many times smaller than the
    # largest layer's.
    "vanishing_ratio": 1e-5,
    # Exploding (inspector.health.gradrows._exploding): a layer grad norm above this, or a
    # gradient per element `exploding_growth` x any later layer's with grad/weight above
    # `exploding_ratio` (one SGD step at lr 0.1 would move the weight by more than its size).
    "exploding_norm": 1e3,
    "exploding_ratio": 10.0,
    "exploding_growth": 1e3,
    # ReLU outputs: share of features that are zero for the whole batch.
    "dead_fraction": 0.5,
    # Fewer values per feature than this: no verdict. A unit alive on 10% of its values looks
    # dead in n of them with chance 0.9**n: 43% at 8, 3% at 32. torchvision SqueezeNet 1.1
    # (seed 0) at 64 px, batch 2: 54% of Fire 9's squeeze units were zero on their 18 values
    # (2 images x 3 x 3), over the 50% line; on 288 values (batch 32) 46%, at 224 px on 1352
    # values 48%: the sample, not the model, put it over the line.
    "dead_min_samples": DEAD_MIN_SAMPLES,
    # Sigmoid/tanh outputs: share within 1e-3 of the bounds.
    "saturated_fraction": 0.5,
    # rms(x - bf16(x)) / std(x): the signal drowns in bf16 rounding noise.
    "bf16_error": 0.05,
    # Train vs eval: a node diverges when |train - eval| > atol + rtol * |eval|.
    "mode_atol": 1e-5,
    "mode_rtol": 1e-4,
    # BatchNorm in train mode: fewer values per channel than this is a warning (1 is an error).
    "bn_min_values": 8,
    # A module holding this share of the saved activations is a checkpointing candidate.
    "checkpoint_share": 0.3,
}

GRADIENT_KEYS = ("vanishing_ratio", "exploding_norm", "exploding_ratio", "exploding_growth")


def resolve(options: Options) -> dict[str, float]:
    """The defaults with the user's overrides (unknown keys kept, so typos show in reports)."""
    merged = dict(DEFAULTS)
    merged.update({k: float(v) for k, v in (getattr(options, "thresholds", None) or {}).items()})
    return merged

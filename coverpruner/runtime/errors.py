"""The runtime's errors (part of its public API); defined once in coverpruner.errors, the bottom layer."""

from __future__ import annotations

from coverpruner.errors import (CoverPrunerError, ImageError, ManifestError, OptionError, PromptError, SamplingError,
                                VideoError)

__all__ = ["CoverPrunerError", "ManifestError", "ImageError", "VideoError", "PromptError", "OptionError",
           "SamplingError"]

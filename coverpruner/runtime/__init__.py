"""coverpruner.runtime: load an engine dir and answer image + question with pruned visual tokens.

Never imports torch or transformers' modeling code.
"""

from coverpruner.runtime.errors import CoverPrunerError, ImageError, ManifestError, OptionError, PromptError, VideoError
from coverpruner.runtime.batching import BatchEvent, BatchGenerator
from coverpruner.runtime.options import GenerationOptions
from coverpruner.runtime.pipeline import METHODS, Pipeline, TextStream
from coverpruner.runtime.result import GenerationResult
from coverpruner.runtime.stages import Request

__all__ = ["Pipeline", "TextStream", "BatchGenerator", "BatchEvent", "GenerationResult", "GenerationOptions", "Request",
           "METHODS", "CoverPrunerError", "ManifestError", "ImageError", "VideoError", "PromptError", "OptionError"]

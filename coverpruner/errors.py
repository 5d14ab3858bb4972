"""The errors every layer shares; each message is one line naming the problem.

Each error carries a machine ``code`` (a per-class default, or the one its raise site names: e.g. PromptError
code "context_length_exceeded") and the ``param`` it is about (the option, field or message path), both set
where it is raised. The CLIs turn every ``CoverPrunerError`` into its one line on stderr and exit code 2; the
server maps ``code`` to an HTTP status and OpenAI error type in one table (serving/errors.py) and reports
``param``: no code is ever derived from message text. They live at the bottom of the layers so that images/,
families/, export/, engines/ and runtime/ raise the same classes; ``coverpruner.runtime`` re-exports them.
"""

from __future__ import annotations

__all__ = ["CoverPrunerError", "ManifestError", "ImageError", "VideoError", "PromptError", "OptionError",
           "SamplingError", "CODES"]


class CoverPrunerError(Exception):
    """Base class: a user-facing problem with the engine dir, the image, the prompt or an option.

    code: machine id of the problem (default: the class's ``default_code``; one of CODES); param: the option,
    request field or message path it is about, or None.
    """

    default_code = "invalid_request"

    def __init__(self, message: str = "", *, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.code = code or self.default_code
        self.param = param


class ManifestError(CoverPrunerError):
    """Missing directory or manifest, unknown format version, missing/invalid field, hash mismatch."""

    default_code = "invalid_engine_dir"


class ImageError(CoverPrunerError):
    """Image file missing, unreadable or corrupt."""

    default_code = "invalid_image"


class VideoError(ImageError):
    """Video file missing, unreadable, corrupt, without a video stream, or with more frames than allowed. A kind of
    ImageError, so every place that reports a bad image (exit code 2, HTTP 400) reports a bad video the same way."""

    default_code = "invalid_video"


class PromptError(CoverPrunerError):
    """Prompt does not fit the context window, or the chat template cannot hold it."""

    default_code = "invalid_prompt"


class OptionError(CoverPrunerError):
    """Unknown method, provider, budget or sampling option (param: the option's name)."""

    default_code = "invalid_value"


class SamplingError(CoverPrunerError):
    """One answer's logits cannot be sampled (NaN, or no finite maximum: a decoder fault). That request fails
    alone; the request itself was valid, so the server reports it as its own fault (500)."""

    default_code = "sampling_failed"


#: Every code a CoverPrunerError may carry (class defaults and the ones raise sites name) -> what it means.
#: serving/errors.py maps each to an HTTP status; tests/serving/test_error_codes.py raises each one.
CODES = {
    "invalid_request": "a problem with the request that no narrower code names",
    "invalid_engine_dir": "the engine dir is missing, malformed or changed on disk (the server's fault)",
    "invalid_image": "an image is missing, unreadable or corrupt",
    "invalid_video": "a video is missing, unreadable, corrupt or has too many frames",
    "video_too_large": "a video's file is over the byte limit, or its sampled frames hold more pixels than max_video_pixels",
    "invalid_prompt": "the messages or the prompt are malformed",
    "context_length_exceeded": "the prompt does not fit the model's context",
    "too_many_parts": "more messages and content parts than a request may hold (runtime/messages.MAX_PARTS)",
    "too_many_images": "more images and videos than the request's max_images",
    "invalid_value": "an option has the wrong type, is out of range or unknown",
    "grammar_too_complex": "a response_format / tool schema is over a size limit, or its grammar costs more per token "
                           "than the budget (runtime/grammar.py)",
    "sampling_failed": "the decoder's logits for one answer could not be sampled (NaN: the server's fault)",
}

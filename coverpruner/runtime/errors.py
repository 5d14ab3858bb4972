"""Errors the runtime raises for bad input; each message is one line that names the problem.

The CLI turns every ``CoverPrunerError`` into that one line on stderr and exit code 2.
"""

from __future__ import annotations


class CoverPrunerError(Exception):
    """Base class: a user-facing problem with the engine dir, the image, the prompt or an option."""


class ManifestError(CoverPrunerError):
    """Missing directory or manifest, unknown format version, missing/invalid field, hash mismatch."""


class ImageError(CoverPrunerError):
    """Image file missing, unreadable or corrupt."""


class PromptError(CoverPrunerError):
    """Prompt does not fit the context window, or the chat template cannot hold it."""


class OptionError(CoverPrunerError):
    """Unknown method, provider, budget or sampling option."""

"""Errors the runtime raises for bad input; each message is one line that names the problem.

The CLI turns every ``CoverPrunerError`` into that one line on stderr and exit code 2.
"""

from __future__ import annotations

from coverpruner.errors import CoverPrunerError, ManifestError  # shared with export/ and engines/

__all__ = ["CoverPrunerError", "ManifestError", "ImageError", "PromptError", "OptionError"]


class ImageError(CoverPrunerError):
    """Image file missing, unreadable or corrupt."""


class PromptError(CoverPrunerError):
    """Prompt does not fit the context window, or the chat template cannot hold it."""


class OptionError(CoverPrunerError):
    """Unknown method, provider, budget or sampling option."""

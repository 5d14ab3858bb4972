"""The errors every layer shares (export, engines, runtime); each message is one line naming the problem.

The CLIs turn every ``CoverPrunerError`` into that one line on stderr and exit code 2. The runtime's
other errors (ImageError, PromptError, OptionError) live in coverpruner.runtime.errors.
"""

from __future__ import annotations


class CoverPrunerError(Exception):
    """Base class: a user-facing problem with the engine dir, the image, the prompt or an option."""


class ManifestError(CoverPrunerError):
    """Missing directory or manifest, unknown format version, missing/invalid field, hash mismatch."""

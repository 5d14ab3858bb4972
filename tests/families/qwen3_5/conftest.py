"""The Qwen3.5 quirk tests build and run the HF model; their fixtures are in fixtures.py (a root plugin)."""

import pytest

pytest.importorskip("transformers", reason="the Qwen3.5 tests build a checkpoint with transformers")

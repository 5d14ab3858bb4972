"""The Qwen3-VL quirk tests build and run the HF model; their fixtures are in fixtures.py (a root plugin)."""

import pytest

pytest.importorskip("transformers", reason="the Qwen3-VL tests build a checkpoint with transformers")

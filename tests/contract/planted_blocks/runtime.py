"""Run time of the planted family: LLaVA-1.5's, its image rows split into two blocks (the first and second half)."""

import dataclasses

import numpy as np

from coverpruner.families.llava.runtime import LlavaRuntime

#: every decoder layer's sliding window (rows): shorter than the pruned prompts of the test
WINDOW = 40


class BlockRuntime(LlavaRuntime):
    def image_span(self, outputs, vision, options):
        """LLaVA's span; blocks: rows [0, n/2) block 0, [n/2, n) block 1."""
        span = super().image_span(outputs, vision, options)
        n = len(span.rows)
        return dataclasses.replace(span, blocks=(np.arange(n) >= n // 2).astype(np.int64))

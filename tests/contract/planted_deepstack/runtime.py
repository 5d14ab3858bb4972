"""Run time of the planted family: LLaVA-1.5's, plus each image's extra rows from the vision graph's extra outputs."""

import dataclasses

from coverpruner.families.llava.runtime import LlavaRuntime

#: the decoder extras: graph input / vision output name -> the decoder layer whose output it is added to
EXTRAS = {"visual_extra.0": 0, "visual_extra.1": 1}


class DeepStackRuntime(LlavaRuntime):
    def image_span(self, outputs, vision, options):
        """LLaVA's span; extras[name] = the vision output ``name`` [1, n, d] -> [n, d], the same rows as rows."""
        span = super().image_span(outputs, vision, options)
        return dataclasses.replace(span, extras={name: outputs[name][0] for name in EXTRAS})

"""Export time of the planted family: LLaVA-1.5 with AttentionSpec(windows=(WINDOW,) * layers, blocks=True) and the
probe's layer 0 windowed alike."""

from coverpruner.families.contract import AttentionSpec, DecoderSpec
from coverpruner.families.llava.family import LlavaFamily
from planted_blocks.runtime import WINDOW, BlockRuntime


class BlockLlava(LlavaFamily):
    name = "planted_blocks"

    def runtime(self, manifest):
        return BlockRuntime(manifest)

    def decoder_spec(self, config) -> DecoderSpec:
        layers = config.text_config.num_hidden_layers
        return DecoderSpec(attention=AttentionSpec(windows=(WINDOW,) * layers, blocks=True))

    def probe_parts(self, model):
        parts = super().probe_parts(model)
        parts.window = WINDOW
        return parts

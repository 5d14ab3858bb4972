"""Gemma 3's run-time rules (numpy only): one 896-px crop per image plus its pan-and-scan crops, a fixed number of
soft tokens per crop, every soft token a candidate (one budget over all crops of an image), each crop's rows one
bidirectional block (contract v5), the chat template with Gemma3Processor's placeholder text, compact positions."""

from __future__ import annotations

import numpy as np

from coverpruner.families.contract import ConversationLayout, GridPanel, ImageSpan, RequestOption, VisionInputs
from coverpruner.families.gemma3.preprocess import Gemma3ImageSettings, preprocess
from coverpruner.families.hf import LOCATED_ROLES, CompactPositions, HFRuntime

#: the chat template's image placeholder (Gemma3Processor expands it); the rows are IMAGE_SOFT_TOKEN
BOI_TOKEN = "<start_of_image>"
EOI_TOKEN = "<end_of_image>"
IMAGE_SOFT_TOKEN = "<image_soft_token>"


def parse_bool(value) -> bool:
    """True / False, or a CLI string (true/false, yes/no, on/off, 1/0); ValueError (one line) otherwise."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ValueError(f"pan_and_scan must be true or false, got {value!r}")


PAN_AND_SCAN_OPTION = RequestOption(
    "pan_and_scan", "Gemma 3: also encode pan-and-scan crops of an elongated image (Gemma3Processor's "
    "do_pan_and_scan; each crop adds its own soft tokens, one budget over all of them). Default: the export's "
    "processor setting (off for google/gemma-3-*-it)", default=None, parse=parse_bool, metavar="true|false")


def placeholder(tokens_per_crop: int, crops: int) -> str:
    """The text Gemma3Processor puts where the chat template rendered <start_of_image>: the image's soft tokens
    between the markers, and with pan-and-scan crops the original image's sequence then each crop's."""
    seq = f"\n\n{BOI_TOKEN}{IMAGE_SOFT_TOKEN * tokens_per_crop}{EOI_TOKEN}\n\n"
    if not crops:
        return seq
    return (f"Here is the original image {seq} and here are some crops to help you see better "
            + " ".join([seq] * crops))


class Gemma3Runtime(CompactPositions, HFRuntime):
    """Gemma 3's run-time rules for one engine dir (contract.FamilyRuntime)."""

    image_token = BOI_TOKEN
    reserved_strings = (IMAGE_SOFT_TOKEN, EOI_TOKEN)
    add_special_tokens = False  # the chat template renders <bos>

    def __init__(self, manifest):
        super().__init__(manifest)
        self.settings = Gemma3ImageSettings.from_dict(manifest.processor)
        #: soft tokens per crop (mm_tokens_per_image) and the side of their square grid
        self.tokens = int(manifest.dims["mm_tokens_per_image"])
        self.side = int(round(self.tokens ** 0.5))

    def prepare_image(self, image, options: dict) -> VisionInputs:
        """pixel_values [1 + c, 3, s, s] (the image, then its pan-and-scan crops) in the graph's float dtype; one
        panel per crop: its soft-token grid over the region it shows."""
        pan = options.get(PAN_AND_SCAN_OPTION.name)
        pan = self.settings.do_pan_and_scan if pan is None else pan
        pixels, (width, height), boxes = preprocess(image, self.settings, pan)
        regions = [(0, 0, width, height)] + list(boxes)
        panels = tuple(
            GridPanel("whole image" if k == 0 else f"pan-and-scan crop {k}", (self.side, self.side),
                      tuple(float(v) for v in box), np.arange(k * self.tokens, (k + 1) * self.tokens, dtype=np.int64))
            for k, box in enumerate(regions))
        return VisionInputs({"pixel_values": pixels.astype(self.float_dtype)}, len(regions) * self.tokens, panels,
                            {"size": (width, height), "crops": len(boxes)})

    def image_span(self, outputs: dict, vision: VisionInputs, options: dict) -> ImageSpan:
        """image_features [1 + c, T, d] -> rows [(1 + c) T, d], every row a candidate, crop k's rows block k."""
        feats = outputs["image_features"]
        crops = 1 + vision.facts["crops"]
        if feats.ndim != 3 or feats.shape[:2] != (crops, self.tokens):
            raise ValueError(f"vision graph returned image_features {list(feats.shape)}, expected "
                             f"[{crops}, {self.tokens}, d]")
        n = crops * self.tokens
        return ImageSpan(feats.reshape(n, feats.shape[2]), np.arange(n, dtype=np.int64),
                         blocks=np.repeat(np.arange(crops, dtype=np.int64), self.tokens))

    def placeholder_text(self, token: str, rows: int, facts: dict) -> str:
        """Gemma3Processor's image sequence (with its crops' sequences under pan-and-scan)."""
        crops = facts.get("crops", 0)
        if rows != (1 + crops) * self.tokens:
            raise ValueError(f"an image of {crops} pan-and-scan crops has {(1 + crops) * self.tokens} rows, got {rows}")
        return placeholder(self.tokens, crops)

    def conversation_layout(self, tokenizer, messages: list[dict], rows_per_image: list[int],
                            media: list[dict] | None = None, tools: list | None = None,
                            template_kwargs: dict | None = None) -> ConversationLayout:
        """The HF base's layout with Gemma's template semantics: it trims the text parts of every turn (``| trim``;
        a leading system message's text is used as written), and each image placeholder becomes Gemma3Processor's
        sequence (media: each image's facts; None: no crops). Only the turns whose text goes through the template as
        sentinels (hf.LOCATED_ROLES) are trimmed here; assistant turns reach the template as given, which trims them."""
        trimmed = [{**m, "content": [{**p, "text": p["text"].strip()} if p["type"] == "text" else p
                                     for p in m["content"]]} if (i or m["role"] != "system")
                   and m["role"] in LOCATED_ROLES else m
                   for i, m in enumerate(messages)]
        media = media if media is not None else [{} for _ in rows_per_image]
        return super().conversation_layout(tokenizer, trimmed, rows_per_image, media, tools, template_kwargs)

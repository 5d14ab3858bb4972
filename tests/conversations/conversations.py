"""The conversations of issue 19's acceptance list, in OpenAI format (images as {"type": "image"} parts with
PIL images, or {"type": "image_url"} with a data: URL; both are accepted by Pipeline.chat)."""

from __future__ import annotations

import base64
import io

from tests.families.llava_next.fixtures import smooth_image  # a test image, not coverpruner code

# (width, height) of images A, B, C: different sizes so LLaVA-NeXT picks different tilings and Qwen2.5-VL
# different grids (S_i differ between images).
SIZES = [(200, 240), (300, 140), (120, 160)]


def image(k: int):
    return smooth_image(*SIZES[k], seed=10 + k)


def data_url(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


SYSTEM = "You answer briefly."
QUESTION_A = "What is in the first picture?"
ANSWER_A = "a red circle"
QUESTION_B = "And what changed in this one?"


def first_turn() -> list[dict]:
    """[system, user(image A + question)]: the prefix of two_turns()."""
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "image", "image": image(0)},
                                         {"type": "text", "text": QUESTION_A}]}]


def two_turns() -> list[dict]:
    """[system, user(image A + question), assistant(answer), user(image B + question)]."""
    return first_turn() + [
        {"role": "assistant", "content": ANSWER_A},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image(1))}},
                                     {"type": "text", "text": QUESTION_B}]}]


def text_only() -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Name three colours."},
            {"role": "assistant", "content": [{"type": "text", "text": "red green blue"}]},
            {"role": "user", "content": "And two more?"}]


def three_images() -> list[dict]:
    return [{"role": "user", "content": [{"type": "image", "image": image(0)}, {"type": "image", "image": image(1)},
                                         {"type": "image", "image": image(2)},
                                         {"type": "text", "text": "Which picture is the brightest?"}]}]


CONVERSATIONS = {"two_turns": two_turns, "text_only": text_only, "three_images": three_images}

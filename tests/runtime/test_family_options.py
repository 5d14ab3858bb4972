"""Family request options flow generically: manifest default -> Pipeline.generate kwargs -> coverpruner-run flags.

A test family (LLaVA-1.5 plus a `mirror` option that flips the image left-right before the vision tower) is
registered for these tests only; the expectation is built independently by mirroring the image with PIL and
running the plain LLaVA pipeline on it.
"""

import json
import shutil

import pytest
from PIL import Image, ImageOps

from coverpruner.families.contract import RequestOption
from coverpruner.families.llava import LlavaFamily, LlavaRuntime
from coverpruner.runtime import OptionError, Pipeline

pytestmark = pytest.mark.slow
Q = "What is shown in this image?"
KW = dict(budget=16, method="divprune", max_new_tokens=3)


class MirrorRuntime(LlavaRuntime):
    def prepare_image(self, image, options):
        img = Image.open(image) if not isinstance(image, Image.Image) else image
        return super().prepare_image(ImageOps.mirror(img) if options["mirror"] == "yes" else img, options)


class MirrorFamily(LlavaFamily):
    name = "llava_mirror"
    request_options = (RequestOption("mirror", "flip the image left-right first", default="no", choices=("no", "yes")),)

    def runtime(self, manifest):
        return MirrorRuntime(manifest)


@pytest.fixture
def mirror_dir(tiny_export, tmp_path, monkeypatch):
    import coverpruner.families as families

    monkeypatch.setitem(families.FAMILIES, "llava_mirror", families.FamilyEntry(f"{__name__}:MirrorFamily", ("llava",)))
    families.get_family.cache_clear()
    d = shutil.copytree(tiny_export, tmp_path / "mirror")
    m = json.loads((d / "manifest.json").read_text())
    m["family"], m["options"] = "llava_mirror", {"mirror": "yes"}  # the export-time default
    (d / "manifest.json").write_text(json.dumps(m))
    yield d
    families.get_family.cache_clear()


def test_options_reach_the_family(mirror_dir, pipe, demo_image):
    mirrored = ImageOps.mirror(Image.open(demo_image).convert("RGB"))
    want_mirrored = pipe.generate(mirrored, Q, **KW)
    want_plain = pipe.generate(Image.open(demo_image).convert("RGB"), Q, **KW)
    assert want_mirrored.kept_indices.tolist() != want_plain.kept_indices.tolist()  # the option matters

    mp = Pipeline.load(mirror_dir)
    assert mp.family_options() == {"mirror": "yes"}
    got = mp.generate(demo_image, Q, **KW)  # manifest default
    assert got.options == {"mirror": "yes"} and got.kept_indices.tolist() == want_mirrored.kept_indices.tolist()
    got = mp.generate(demo_image, Q, mirror="no", **KW)  # per-request override
    assert got.options == {"mirror": "no"} and got.token_ids == want_plain.token_ids
    assert got.kept_indices.tolist() == want_plain.kept_indices.tolist()
    with pytest.raises(OptionError, match=r"mirror must be one of \['no', 'yes'\], got 'maybe'"):
        mp.stream(demo_image, Q, mirror="maybe")


def test_unknown_option_for_the_family(pipe, demo_image):
    with pytest.raises(OptionError, match=r"unknown option\(s\) \['mirror'\] for model family 'llava'; it takes none"):
        pipe.stream(demo_image, Q, mirror="yes")


def test_cli_flags_come_from_the_families(mirror_dir, tiny_export, pipe, demo_image, capsys):
    from coverpruner.runtime.cli import build_parser, main

    assert "--mirror" in build_parser().format_help()
    args = ["--image", str(demo_image), "--prompt", Q, "--budget", "16", "--method", "divprune",
            "--max-new-tokens", "3", "--json"]
    assert main([str(mirror_dir), *args, "--mirror", "no"]) == 0
    res = json.loads(capsys.readouterr().out)
    want = pipe.generate(Image.open(demo_image).convert("RGB"), Q, **KW)
    assert res["options"] == {"mirror": "no"} and res["kept_indices"] == want.kept_indices.tolist()
    assert main([str(tiny_export), *args, "--mirror", "yes"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown option(s) ['mirror'] for model family 'llava'" in err[0]

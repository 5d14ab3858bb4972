"""coverpruner-run: answer a question about an image with an exported engine dir.

    coverpruner-run DIR (--image PATH --prompt TEXT | --messages CONV.json) [--budget N|full] [--method NAME]
                    [--demand turn|latest] [--max-images N] [--ignore-eos] [--prefix-cache-mb MB]
                    [--provider NAME] [--max-new-tokens N] [--stream] [--json] [--save-selection PNG]
                    [method options: --relevance-weight W (cdpruner), --pivots P (dart)]
                    [family options, e.g. --newline-policy drop|keep]

Exit codes: 0 ok, 2 bad input (one line on stderr: missing dir/manifest, unknown version, hash
mismatch, unreadable image, prompt too long, unknown method/provider), 1 unexpected failure.
"""

from __future__ import annotations

import argparse
import json
import re
import os
import sys
from pathlib import Path

from coverpruner.integers import cli_int
from coverpruner.progress import spinner
from coverpruner.engines.ort import PROVIDERS
from coverpruner.families import request_options
from coverpruner.runtime.errors import CoverPrunerError, OptionError
from coverpruner.runtime.options import GenerationOptions
from coverpruner.runtime.pipeline import METHODS, parse_budget
from coverpruner.selection import METHOD_OPTIONS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="coverpruner-run", description=__doc__.split("\n\n")[0])
    p.add_argument("engine_dir", metavar="DIR", help="engine dir written by coverpruner-export")
    req = p.add_argument_group("request")
    req.add_argument("--image", default=None, help="image file (PNG, JPEG, ...)")
    req.add_argument("--prompt", default=None, help="question about the image")
    req.add_argument("--messages", metavar="CONV.json", default=None,
                     help="a conversation instead of --image/--prompt: a JSON list of OpenAI-format messages "
                          "(system / user / assistant; image_url parts with data: URLs or local paths, relative "
                          "to the file's folder; Qwen2.5-VL: video parts {\"type\": \"video\", \"video\": "
                          "FILE or [FRAME files], \"fps\": F})")
    req.add_argument("--demand", choices=("turn", "latest"), default="turn",
                     help="an image's demand from its own message (turn, default) or the last user message")
    req.add_argument("--max-images", type=cli_int, default=None, help="most images per request (default: manifest, 8)")
    prune = p.add_argument_group("pruning")
    prune.add_argument("--budget", default=None,
                       help="visual tokens to keep (integer) or 'full' for no pruning (default: manifest)")
    prune.add_argument("--method", default=None,
                       help=f"selection method, one of {', '.join(METHODS)} (default: manifest)")
    prune.add_argument("--tau", type=float, default=None, help="demand temperature (default: manifest, 0.3)")
    prune.add_argument("--selector", choices=("auto", "onnx", "numpy"), default="auto",
                       help="run the coverpruner method with the dir's selector.onnx or in numpy "
                            "(default auto: selector.onnx when the dir has its standard-op form, numpy on CPU "
                            "above 2,048 candidates)")
    for name, opt in sorted(METHOD_OPTIONS.items()):  # a method's own options (its registry declaration)
        prune.add_argument("--" + name.replace("_", "-"), dest=f"method_{name}", type=type(opt.default),
                           default=None, help=opt.help)
    gen = p.add_argument_group("generation")
    gen.add_argument("--max-new-tokens", type=cli_int, default=128, help="answer length limit (default 128)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 (or anything below 1e-5) = greedy (default 0)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0)")
    gen.add_argument("--seed", type=cli_int, default=None, help="sampling / random-method seed")
    gen.add_argument("--ignore-eos", action="store_true", help="decode past EOS up to --max-new-tokens")
    fam = p.add_argument_group("model family options (default: the engine dir's)")
    for name, (opt, families) in sorted(request_options().items()):
        choices = f" ({'|'.join(map(str, opt.choices))})" if opt.choices else ""
        fam.add_argument("--" + name.replace("_", "-"), dest=f"family_{name}", default=None,
                         metavar=opt.metavar or name.upper(), help=f"{opt.help}{choices} [{', '.join(families)}]")
    eng = p.add_argument_group("engine")
    eng.add_argument("--provider", default="cpu", help=f"execution provider: {', '.join(PROVIDERS)} (default cpu)")
    eng.add_argument("--threads", type=cli_int, default=None, help="intra-op threads (default: ORT's choice)")
    eng.add_argument("--prefix-cache-mb", type=float, default=0,
                     help="MiB for reusing pruned prefixes within this run (default 0: off; one request per run)")
    out = p.add_argument_group("output")
    out.add_argument("--stream", action="store_true", help="print the answer as it is decoded")
    out.add_argument("--json", action="store_true",
                     help="print the result with timings as JSON (compact: number lists on one line, no relevance "
                          "scores; --json-full adds them)")
    out.add_argument("--json-full", action="store_true",
                     help="with --json: also every candidate's relevance score (per image)")
    out.add_argument("--save-selection", metavar="PNG", default=None,
                     help="draw kept patches over the image (pruned ones dimmed) into this PNG")
    return p


def _drawable(pipe, images: list, options: dict) -> list:
    """The conversation's images with each video replaced by the frames its family sampled (what the picture
    draws); a video reached here was already read and sampled once by the request itself. options: the family's
    request options as the request applied them (GenerationResult.options)."""
    from coverpruner.video import VideoInput

    return [pipe.family_runtime.sampled_frames(im, options) if isinstance(im, VideoInput) else im for im in images]


def _format_timings(result) -> str:
    t = result.timings_ms
    return ("timings ms: " + " ".join(f"{k}={t[k]:.1f}" for k in
                                      ("preprocess", "vision", "embed", "probe", "select", "prefill", "decode", "total"))
            + f" | decode {result.decode_tokens_per_s:.1f} tok/s | kept "
              f"{sum(len(i.kept_indices) for i in result.images)}/{sum(i.num_visual_tokens for i in result.images)}"
              f" visual tokens of {len(result.images)} image(s), prefill {result.prefill_tokens} tokens"
              + (f" ({result.cached_tokens} cached)" if result.cached_tokens else ""))


def result_json(result: dict, full: bool = False) -> str:
    """GenerationResult.to_dict() as --json prints it: indented, but each list of numbers on one line (a list per
    line instead of one number per line: ~490 lines before); the relevance scores (one per candidate, per image)
    only when ``full``."""
    def drop(obj):
        if isinstance(obj, dict):
            return {k: drop(v) for k, v in obj.items() if full or k != "relevance"}
        if isinstance(obj, list):
            return [drop(v) for v in obj]
        return obj

    text = json.dumps(drop(result), indent=2)
    return re.sub(r"\[\s*((?:-?[\d.eE+-]+|null)(?:,\s*(?:-?[\d.eE+-]+|null))*)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)


def engine_precision(manifest) -> dict:
    """What --json reports about the engine dir's numbers: activation precision, weight precision and the
    manifest's weight-only quantization record (None for float weights)."""
    quant = manifest.raw.get("quantization")
    return {"precision": manifest.precision, "weights": quant["dtype"] if quant else manifest.precision,
            "quantization": quant}


def read_messages(path: str) -> list:
    """CONV.json -> the message list, local image and video paths (a video file, or a video's frame files) made
    relative to the file's folder. OptionError (one line naming the file) when it cannot be read or is not a JSON
    list."""
    from pathlib import Path

    file = Path(path)
    try:
        messages = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionError(f"{file}: cannot read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise OptionError(f"{file}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(messages, list):
        raise OptionError(f"{file}: expected a JSON list of messages, got {type(messages).__name__}")
    for msg in messages:
        for part in msg.get("content", []) if isinstance(msg, dict) and isinstance(msg.get("content"), list) else []:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "image" and isinstance(part.get("image"), str):
                part["image"] = str(file.parent / part["image"])
            elif part.get("type") == "video":  # a video file or a list of frame files, relative to CONV.json
                video = part.get("video")
                if isinstance(video, str) and not video.startswith(("http://", "https://")):
                    part["video"] = str(file.parent / video.removeprefix("file://"))
                elif isinstance(video, list):
                    part["video"] = [str(file.parent / f) if isinstance(f, str) else f for f in video]
            elif part.get("type") == "image_url":
                url = part.get("image_url")
                key = isinstance(url, dict) and isinstance(url.get("url"), str)
                url = url["url"] if key else url
                if isinstance(url, str) and not url.startswith(("data:", "http://", "https://")):
                    local = str(file.parent / url.removeprefix("file://"))
                    part["image_url"] = {"url": local} if key else local
    return messages


def check_png_path(path: str) -> None:
    """--save-selection: a .png file name in an existing, writable folder (checked before any work)."""
    p = Path(path)
    if p.is_dir():
        raise OptionError(f"--save-selection {path}: is a directory; give a file name ending in .png")
    if p.suffix.lower() != ".png":
        raise OptionError(f"--save-selection {path}: the file is written as PNG; its name must end in .png")
    parent = p.parent
    if not parent.is_dir():
        raise OptionError(f"--save-selection {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OptionError(f"--save-selection {path}: folder {parent} is not writable")


def run(args) -> int:
    from coverpruner.runtime.pipeline import Pipeline

    if args.provider not in PROVIDERS:
        raise OptionError(f"unknown provider {args.provider!r}; expected one of {list(PROVIDERS)}")
    if args.method is not None and args.method not in METHODS:
        raise OptionError(f"unknown method {args.method!r}; expected one of {list(METHODS)}")
    if (args.messages is None) == (args.image is None and args.prompt is None) or \
            (args.messages is None and (args.image is None or args.prompt is None)):
        raise OptionError("give --image and --prompt, or --messages CONV.json (not both)")
    if args.save_selection:
        check_png_path(args.save_selection)
    messages = read_messages(args.messages) if args.messages is not None else None
    with spinner(f"loading {args.engine_dir}"):  # seconds for a 7B dir: say so on a terminal
        pipe = Pipeline.load(args.engine_dir, provider=args.provider, threads=args.threads, selector=args.selector,
                             prefix_cache_mb=args.prefix_cache_mb)
    defaults = pipe.manifest.defaults
    budget = parse_budget(args.budget if args.budget is not None else defaults.get("budget", 64))
    method = args.method or defaults.get("method", "coverpruner")
    # family options and the selection method's own options by their names (the pipeline tells them apart)
    options = {k.split("_", 1)[1]: v for k, v in vars(args).items()
               if k.startswith(("family_", "method_")) and v is not None}
    opts = GenerationOptions(budget=budget, method=method, tau=args.tau, demand=args.demand,
                             max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                             seed=args.seed, ignore_eos=args.ignore_eos, max_images=args.max_images, family=options)
    if messages is not None:
        stream = pipe.chat_stream(messages, options=opts)
    else:
        stream = pipe.stream(args.image, args.prompt, options=opts)
    for piece in stream:
        if args.stream and not args.json:
            print(piece, end="", flush=True)
    result = stream.result
    if args.save_selection:
        from coverpruner.runtime.visualize import save_selection

        if messages is not None:
            from coverpruner.runtime.messages import normalize
            from coverpruner.runtime.visualize import save_conversation

            if not result.images:
                raise OptionError("--save-selection: the conversation has no image to draw")
            save_conversation(args.save_selection, _drawable(pipe, normalize(messages).images, result.options),
                              result.images)
        else:
            save_selection(args.save_selection, args.image, result.kept_indices, result.panels)
    if args.json:
        print(result_json({**result.to_dict(), "engine": engine_precision(pipe.manifest)}, args.json_full))
    else:
        print("" if args.stream else result.text)
        print(_format_timings(result), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except CoverPrunerError as exc:
        print(f"coverpruner-run: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""One PNG of several selection methods side by side on one image (issue 26: the peers' pruners beside ours).

    python scripts/peer_selection_picture.py ENGINE_DIR --image photo.jpg --prompt "What is on the table?" \
        --budget 64 --methods coverpruner,divprune,dart,cdpruner --out selections.png

Runs one request per method (max_new_tokens 1: the selection is made before decoding) and draws each kept set
over the image with runtime/visualize.py's draw_methods. Bad input: one line, exit 2.
"""

from __future__ import annotations

import argparse
import sys

from coverpruner.runtime.errors import CoverPrunerError, OptionError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("engine_dir")
    p.add_argument("--image", required=True)
    p.add_argument("--prompt", required=True)
    p.add_argument("--budget", type=int, default=64)
    p.add_argument("--methods", default="coverpruner,divprune,dart,cdpruner")
    p.add_argument("--out", required=True, help="PNG to write")
    args = p.parse_args(argv)
    try:
        from coverpruner.runtime.cli import check_png_path
        from coverpruner.runtime.pipeline import METHODS, Pipeline
        from coverpruner.runtime.visualize import save_methods

        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        unknown = [m for m in methods if m not in METHODS]
        if unknown or not methods:
            raise OptionError(f"--methods: unknown method(s) {unknown}; expected some of {list(METHODS)}")
        check_png_path(args.out)
        pipe = Pipeline.load(args.engine_dir)
        results = {m: pipe.generate(args.image, args.prompt, budget=args.budget, method=m, max_new_tokens=1)
                   for m in methods}
        save_methods(args.out, args.image, {m: (r.kept_indices, r.panels) for m, r in results.items()})
    except CoverPrunerError as exc:
        print(f"peer_selection_picture: error: {exc}", file=sys.stderr)
        return 2
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

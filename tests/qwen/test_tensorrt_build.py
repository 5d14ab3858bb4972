"""TensorRT-RTX parses and builds every Qwen2.5-VL graph with dynamic patch / visual-token / sequence axes."""

import pytest

from coverpruner.engines.tensorrt import BuildOptions, build_engine, load_tensorrt
from coverpruner.export.onnx_io import describe_io

pytestmark = [pytest.mark.tensorrt, pytest.mark.slow]

# Up to the tiny preset's max_pixels (28*28*160 px): 640 patches, 160 visual tokens.
RANGES = {"num_patches": (4, 396, 640), "num_visual": (1, 99, 160), "num_windows": (1, 12, 64),
          "window_slots": (4, 36, 36), "batch": (1, 1, 1), "seq": (1, 150, 512),
          "num_instruction": (1, 16, 512), "past_sequence": (0, 120, 511), "total_sequence": (1, 121, 512)}


@pytest.fixture(scope="module")
def trt_rtx():
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX python bindings are not installed "
                                               "(pip install tensorrt-rtx-cu13 tensorrt-rtx-cu13-libs "
                                               "tensorrt-rtx-cu13-bindings)")
    return load_tensorrt("tensorrt_rtx")


@pytest.mark.parametrize("graph", ["vision", "embed", "probe", "decoder"])
def test_graph_builds_with_dynamic_axes(graph, trt_rtx, qwen_graphs):
    path = qwen_graphs / f"{graph}.onnx"
    _, inputs, outputs = describe_io(path)
    symbolic = {a for spec in inputs for a in spec["shape"] if isinstance(a, str)}
    assert symbolic, f"{graph}: no dynamic axis"
    if graph == "vision":
        assert symbolic == {"num_patches", "num_visual", "num_windows", "window_slots"}
    blob, record = build_engine(trt_rtx, path, graph, {"inputs": inputs}, RANGES, BuildOptions(), "fp32", "fp32")
    assert len(blob) > 1000
    assert set(record["profile"]) == {s["name"] for s in inputs if any(isinstance(a, str) for a in s["shape"])}

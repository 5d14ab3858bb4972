# Architecture v3 (issue 16, source layering): rewrite test imports from the old module names to the new ones.
# Apply from the repository root:  find tests -name '*.py' -exec sed -i -f scripts/v3_test_imports.sed {} +
# It is idempotent (every pattern names an old module only), so it can be re-applied after tests/ moves.
#
# old module                                  -> new module
# coverpruner.runtime.preprocess (load/RGB)   -> coverpruner.images
# coverpruner.runtime.preprocess (CLIP steps) -> coverpruner.families.clip
# coverpruner.families.base                   -> coverpruner.families.hf
# coverpruner.families.llava (crop_box)       -> coverpruner.families.clip
# coverpruner.families.anyres                 -> coverpruner.families.llava_next.anyres
# coverpruner.families.llava_next (panels)    -> coverpruner.families.llava_next.runtime
# coverpruner.families.qwen_preprocess        -> coverpruner.families.qwen2_5_vl.preprocess
# coverpruner.families.qwen_vision            -> coverpruner.families.qwen2_5_vl.vision
# coverpruner.families.qwen_positions         -> coverpruner.families.qwen2_5_vl.positions
# coverpruner.families.qwen_graphs            -> coverpruner.families.qwen2_5_vl.graphs
# coverpruner.families.qwen2_5_vl (module)    -> coverpruner.families.qwen2_5_vl (package; same names)
# coverpruner.export.modules.VisionGraph      -> coverpruner.families.hf_graphs.VisionGraph
# coverpruner.export.selector_graph.build_selector_model -> coverpruner.export.selector.build_selector_model
# coverpruner.export.quant.engine_dir         -> coverpruner.export.quant.quantize_dir
# coverpruner.testing.checkpoints.main        -> coverpruner.testing.cli.main
# coverpruner.testing.checkpoints (LLaVA-1.5 writer: build_config, build_processor, LLAVA_HF_CHAT_TEMPLATE)
#                                             -> coverpruner.testing.llava_checkpoints
# coverpruner.testing.checkpoints.write_checkpoint stays.
# families._ADAPTERS / families._MODEL_TYPES (two dicts) -> families.FAMILIES (one table of FamilyEntry)

s/from coverpruner\.runtime\.preprocess import to_rgb, load_image/from coverpruner.images import load_image, to_rgb/
s/from coverpruner\.runtime\.preprocess import \(ImageSettings\|resize_size\|preprocess_image\)/from coverpruner.families.clip import \1/
s/from coverpruner\.families\.base import/from coverpruner.families.hf import/
s/from coverpruner\.families\.llava import crop_box/from coverpruner.families.clip import crop_box/
s/from coverpruner\.families\.anyres import/from coverpruner.families.llava_next.anyres import/
s/from coverpruner\.families\.llava_next import panels/from coverpruner.families.llava_next.runtime import panels/
s/coverpruner\.families\.qwen_preprocess\b/coverpruner.families.qwen2_5_vl.preprocess/g
s/coverpruner\.families\.qwen_vision\b/coverpruner.families.qwen2_5_vl.vision/g
s/coverpruner\.families\.qwen_positions\b/coverpruner.families.qwen2_5_vl.positions/g
s/coverpruner\.families\.qwen_graphs\b/coverpruner.families.qwen2_5_vl.graphs/g
s/from coverpruner\.export\.modules import VisionGraph/from coverpruner.families.hf_graphs import VisionGraph/
s/from coverpruner\.export\.selector_graph import build_selector_model/from coverpruner.export.selector import build_selector_model/
s/coverpruner\.export\.quant\.engine_dir\b/coverpruner.export.quant.quantize_dir/g
s/from coverpruner\.testing\.checkpoints import main\b/from coverpruner.testing.cli import main/
s/from coverpruner\.testing\.checkpoints import \(build_config\|LLAVA_HF_CHAT_TEMPLATE\|build_processor\|tower_configs\)/from coverpruner.testing.llava_checkpoints import \1/
s/"coverpruner\.testing\.checkpoints", "--preset"/"coverpruner.testing.cli", "--preset"/
# a test family registered for one test: one FamilyEntry (it handles model_type "llava" after the real one)
s/monkeypatch\.setitem(families\._ADAPTERS, \("[^"]*"\), \(f\?"[^"]*"\))/monkeypatch.setitem(families.FAMILIES, \1, families.FamilyEntry(\2, ("llava",)))/
# model_type "llava" -> that test family: its entry takes the "llava" key (first in the table for that model type)
s/monkeypatch\.setitem(families\._MODEL_TYPES, "llava", \("[^"]*"\))/monkeypatch.setitem(families.FAMILIES, "llava", families.FAMILIES[\1])/

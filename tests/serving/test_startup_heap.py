"""Issue 40: a server process's start-up objects are frozen out of the garbage collector's full passes
(serving/memory.freeze_startup_heap, called by coverpruner-serve and each Ray replica once the app is built): a
full pass over a served process's ~150,000 start-up objects held the GIL 0.1-0.17 s, and /health with it, during
an answer whose logprobs filled the heap. Run in a child process: freezing is for the whole process."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json
from coverpruner.serving.memory import freeze_startup_heap
startup = [{"i": i, "l": [i]} for i in range(200_000)]  # what a server keeps: its modules, pipelines
cycle = []; cycle.append(cycle); del cycle  # start-up garbage: collected, not frozen
frozen = freeze_startup_heap()
request = [{"i": i} for i in range(10_000)]  # what a request makes
gc.collect()
print(json.dumps({"frozen": frozen, "walked": sum(len(gc.get_objects(g)) for g in range(3)), "garbage": gc.garbage}))
"""


def test_a_full_collection_walks_only_what_came_after_start_up():
    out = json.loads(subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True,
                                    timeout=120).stdout)
    assert out["frozen"] >= 400_000  # the dicts and lists kept at start-up
    assert out["walked"] < 50_000, out  # the request's 10,000 and the interpreter's few
    assert out["garbage"] == []


def test_both_server_entry_points_call_it_after_building_the_app():
    import inspect

    from coverpruner.serving import cli, ray_app

    for module in (cli, ray_app):  # the call sits after create_app in both entry points
        source = inspect.getsource(module)
        assert source.index("freeze_startup_heap()") > source.index("create_app(")
        assert source.index("leave_full_collections_to_the_engines()") > source.index("freeze_startup_heap()")


AUTOMATIC = """
import gc, json
from coverpruner.serving.memory import leave_full_collections_to_the_engines
passes = []
gc.callbacks.append(lambda phase, info: passes.append(info["generation"]) if phase == "start" else None)
def churn():
    for _ in range(40):
        keep = [[i] for i in range(20_000)]  # survivors: the young generations' passes promote them
    return keep
churn(); before = passes.count(2); passes.clear()
leave_full_collections_to_the_engines()
churn()
print(json.dumps({"before": before, "full": passes.count(2), "young": len(passes)}))
"""


def test_the_server_leaves_full_passes_to_its_engines_and_keeps_the_young_ones():
    """After leave_full_collections_to_the_engines the collector starts no full pass by itself (the same churn
    started some before), while the young generations' passes go on."""
    out = json.loads(subprocess.run([sys.executable, "-c", AUTOMATIC], capture_output=True, text=True, check=True,
                                    timeout=120).stdout)
    assert out["before"] > 0 and out["full"] == 0 and out["young"] > 0, out

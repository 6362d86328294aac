"""A real two-node Ray cluster on this machine (`ray start --head`, `ray start --address`): the
same grid through `cl-bench run --executor ray --ray-address` and `--executor inline` gives the
same records, and the runs were spread over both nodes. Slow (a minute or more: two Ray nodes
start, and every Ray worker imports torch and Avalanche): marked `cluster`."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import cl_bench_cmd
from ray_cluster import RAY, RayCluster

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.cluster

PROTOCOL = """\
name: ray-cluster
version: "1"
description: two-node Ray cluster test
scenario: task-il
pretrain: first-task
datasets:
  - {name: digits, n_tasks: 3, classes_per_task: 2, model: mlp}
regimes: [head, last-1, full]
methods: [naive, {name: lwf, hparams: {alpha: 1.0, temperature: 2.0}}]
task_orders: {count: 2, seed: 0}
seeds: [0]
training: {optimizer: sgd, lr: 0.05, momentum: 0.9, epochs: 1, batch_size: 32}
evaluation: {batch_size: 512}
"""
# Loaded with --method by every process that runs a spec (the registry imports it once per
# process); it registers no method. In a Ray task it notes the node it runs on and how many
# nodes the cluster has alive at that moment; elsewhere (the driver, inline runs) it does nothing.
PROBE = '''"""Notes which Ray node a worker process runs specs on (registers no method)."""
import json
import os
import sys
from pathlib import Path

ADAPTERS = ()

if "ray" in sys.modules:
    import ray

    if ray.is_initialized() and ray.get_runtime_context().get_task_id():
        alive = sum(1 for node in ray.nodes() if node["Alive"])
        note = {{"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "alive_nodes": alive}}
        Path({folder!r}, f"{{os.getpid()}}.json").write_text(json.dumps(note))
'''
NOT_COMPARED = ("timings", "provenance")  # wall times and host/platform differ between the two sweeps
GRID = 3 * 2 * 2  # regimes x methods x orders


def _grid(folder: Path) -> list[str]:
    (folder / "probes").mkdir()
    (folder / "protocol.yaml").write_text(PROTOCOL)
    (folder / "probe.py").write_text(PROBE.format(folder=str(folder / "probes")))
    return ["run", "--protocol", str(folder / "protocol.yaml"), "--method", str(folder / "probe.py"),
            "--no-mlflow", "--no-leaderboard", "--no-progress"]


def _records(results: Path) -> dict:
    from harness.execution.store import load_records

    return {r.run_id: r.to_dict() for r in load_records(results, "ray-cluster")}


def test_two_node_cluster_sweep_equals_inline(tmp_path, cli):
    if not RAY.is_file():
        pytest.skip(f"no `ray` executable next to {Path(RAY).parent / 'python'} (pip install 'cl-bench[ray]')")
    pytest.importorskip("ray", reason="the [ray] extra is not installed (pip install 'cl-bench[ray]')")
    argv = _grid(tmp_path)
    cluster = RayCluster(nodes=2, cpus=1)
    try:
        cluster.start()                 # returns once `ray status` counts both nodes' CPUs
        node_ids = cluster.node_ids()
        sweep = subprocess.run([*cl_bench_cmd(), *argv, "--executor", "ray", "--ray-address", cluster.address,
                                "--jobs", "2", "--results", str(tmp_path / "on-ray")],
                               cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=900)
    finally:
        cluster.stop()
    assert cluster.processes() == [], "Ray processes of the test cluster are still running"
    assert sweep.returncode == 0, f"{sweep.stdout[-4000:]}\n{sweep.stderr[-4000:]}"
    assert len(node_ids) == 2

    # Spread over the cluster: worker processes on both nodes ran specs, with both nodes alive.
    notes = [json.loads(p.read_text()) for p in (tmp_path / "probes").glob("*.json")]
    assert {n["node_id"] for n in notes} == set(node_ids), notes
    assert all(n["alive_nodes"] == 2 for n in notes), notes

    code, _, err = cli(*argv, "--executor", "inline", "--results", tmp_path / "inline")
    assert code == 0, err
    on_ray, inline = _records(tmp_path / "on-ray"), _records(tmp_path / "inline")
    assert len(inline) == GRID and sorted(on_ray) == sorted(inline)
    for run_id, rec in inline.items():
        other = on_ray[run_id]
        assert rec["status"] == other["status"] == "ok", (rec["error"], other["error"])
        assert other["provenance"]["device"] == rec["provenance"]["device"] == "cpu"
        for key in rec.keys() - set(NOT_COMPARED):
            assert other[key] == rec[key], f"{run_id} ({rec['spec']['method']}, {rec['spec']['regime']}): {key} differs"

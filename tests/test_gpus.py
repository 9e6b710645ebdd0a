"""GPUs shared on one host (nbdist.host.gpus): the placement rule, what each engine process receives, and
the kernel kept off the GPUs after `%load_ext nbdist`. This machine has no GPU: the GPUs here are ids
the host reports (CUDA_VISIBLE_DEVICES / NBDIST_GPUS), which TensorFlow's CPU build ignores."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nbdist.host import gpus
from nbdist.host.gpus import Placement
from tests.kernel_driver import KernelDriver

TWO_GPUS = ["0", "1"]


def test_three_engines_on_two_gpus_round_robin_with_memory_growth():
    plan = gpus.host_plan(3, TWO_GPUS)
    assert [p.devices for p in plan] == [("0",), ("1",), ("0",)]
    assert all(p.memory_growth for p in plan)  # more engines than GPUs: nobody takes a whole GPU
    assert [p.environment() for p in plan] == [
        {"CUDA_VISIBLE_DEVICES": "0", "TF_FORCE_GPU_ALLOW_GROWTH": "true"},
        {"CUDA_VISIBLE_DEVICES": "1", "TF_FORCE_GPU_ALLOW_GROWTH": "true"},
        {"CUDA_VISIBLE_DEVICES": "0", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}]
    assert [p.label() for p in plan] == ["0*", "1*", "0*"]


def test_tensorflow_configuration_when_tensorflow_started_first():
    """set_visible_devices gets these indices into tf.config.list_physical_devices('GPU')."""
    plan = gpus.host_plan(3, TWO_GPUS)
    assert [gpus.visible_indices(p, TWO_GPUS) for p in plan] == [[0], [1], [0]]
    # TensorFlow that started with only GPU 1 visible cannot be given GPU 0
    assert gpus.visible_indices(plan[0], ["1"]) == [] and gpus.visible_indices(plan[1], ["1"]) == [0]


def test_one_engine_per_gpu_keeps_tensorflow_defaults_unless_the_kernel_shares():
    assert gpus.host_plan(2, TWO_GPUS) == [Placement(("0",), False), Placement(("1",), False)]
    assert [p.memory_growth for p in gpus.host_plan(2, TWO_GPUS, kernel_shares=True)] == [True, True]
    assert gpus.host_plan(2, []) == [Placement(), Placement()] and Placement().environment() == {}
    assert gpus.placement(1, 2, ["GPU-5d1a", "GPU-77f0"]).devices == ("GPU-77f0",)  # UUIDs work as ids
    with pytest.raises(ValueError, match="local_rank=3"):
        gpus.placement(3, 2, TWO_GPUS)


def test_local_ranks_group_engines_by_machine_and_keep_known_ones():
    machines = {0: "a", 1: "b", 2: "a", 3: "a", 4: "b"}
    assert gpus.local_ranks(machines) == {0: (0, 3), 2: (1, 3), 3: (2, 3), 1: (0, 2), 4: (1, 2)}
    # engine 2 died; engine 5 joins machine a and takes its free rank, the others keep theirs
    later = gpus.local_ranks({0: "a", 3: "a", 5: "a"}, known={0: 0, 3: 2})
    assert later == {0: (0, 3), 3: (2, 3), 5: (1, 3)}


def test_host_gpus_prefers_the_override_then_what_the_kernel_had():
    assert gpus.host_gpus({"NBDIST_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0"}) == ["2", "3"]
    assert gpus.host_gpus({"NBDIST_CUDA_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": ""}) == TWO_GPUS
    assert gpus.host_gpus({"CUDA_VISIBLE_DEVICES": "1"}) == ["1"]
    assert gpus.host_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert not os.path.exists("/proc/driver/nvidia/gpus"), "this test expects a machine without NVIDIA GPUs"
    assert gpus.host_gpus({"NBDIST_CUDA_VISIBLE_DEVICES": "<unset>", "CUDA_VISIBLE_DEVICES": ""}) == []


PIN_THEN_TENSORFLOW = """
import json, os, sys
from nbdist.host import gpus
gpus.pin(int(sys.argv[1]), 3)
import tensorflow as tf
print(json.dumps({"env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "TF_FORCE_GPU_ALLOW_GROWTH")},
                  "pinned": gpus.pinned(), "tf_gpus": [d.name for d in tf.config.get_visible_devices("GPU")]}))
"""


@pytest.mark.cluster  # starts processes
def test_each_engine_process_of_a_two_gpu_host_receives_its_environment():
    """Three engine processes of one host with 2 GPUs, each pinned before TensorFlow starts in it."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    seen = []
    for rank in range(3):
        done = subprocess.run([sys.executable, "-c", PIN_THEN_TENSORFLOW, str(rank)], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        seen.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert [s["env"] for s in seen] == [{"CUDA_VISIBLE_DEVICES": d, "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
                                        for d in ("0", "1", "0")]
    assert [s["pinned"] for s in seen] == [{"gpu": f"{d}*", "how": "environment", "local_rank": r}
                                           for r, d in enumerate("010")]
    assert all(s["tf_gpus"] == [] for s in seen)  # the CPU build of TensorFlow: no GPU to see


@pytest.fixture
def gpu_kernel():
    """A kernel whose host has GPUs 0 and 1 (as CUDA_VISIBLE_DEVICES says); stopped with its cluster."""
    drivers = []

    def start(env_extra=None):
        driver = KernelDriver(env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1", **(env_extra or {})})
        drivers.append(driver)
        return driver

    try:
        yield start
    finally:
        for driver in drivers:
            try:
                driver.run("%dist stop", timeout=60)
            finally:
                driver.stop()


KERNEL_STATE = ("(os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('NBDIST_CUDA_VISIBLE_DEVICES'), "
                "nbdist.host.gpus.kernel_uses_gpus())")
ENGINE_STATE = ("nbdist.get_session().cluster.client[:].apply_sync(lambda: (__import__('os').environ["
                "'CUDA_VISIBLE_DEVICES'], __import__('os').environ['TF_FORCE_GPU_ALLOW_GROWTH']))")


@pytest.mark.cluster  # starts processes
@pytest.mark.cluster
@pytest.mark.timeout(400)
def test_kernel_hides_gpus_and_three_engines_share_two(gpu_kernel):
    kernel = gpu_kernel()
    kernel.run("import os\n%load_ext nbdist\nimport nbdist").check()
    assert kernel.value(KERNEL_STATE) == ["", "0,1", False]
    kernel.run("import tensorflow as tf").check()
    assert kernel.value("tf.config.get_visible_devices('GPU')") == []
    status = kernel.run("%dist start -n 3", timeout=240).check().stdout
    assert kernel.value(ENGINE_STATE) == [["0", "true"], ["1", "true"], ["0", "true"]]
    rows = [line.split() for line in status.splitlines() if line[:1].isdigit()]
    assert [row[-1] for row in rows] == ["0*", "1*", "0*"], status
    assert "memory growth is on" in status
    assert kernel.value(KERNEL_STATE) == ["", "0,1", False]  # the kernel stays off the GPUs


@pytest.mark.cluster  # starts processes
@pytest.mark.cluster
@pytest.mark.timeout(400)
def test_kernel_gpu_gives_the_kernel_its_gpus_and_engines_grow(gpu_kernel):
    kernel = gpu_kernel()
    kernel.run("import os\n%load_ext nbdist\nimport nbdist").check()
    status = kernel.run("%dist start -n 2 --kernel-gpu", timeout=240).check().stdout
    assert kernel.value(KERNEL_STATE) == ["0,1", None, True]
    # one engine per GPU, but the kernel shares them: memory growth on both
    assert kernel.value(ENGINE_STATE) == [["0", "true"], ["1", "true"]]
    assert [line.split()[-1] for line in status.splitlines() if line[:1].isdigit()] == ["0*", "1*"]


@pytest.mark.cluster  # starts processes
def test_kernel_that_imported_tensorflow_first_hides_gpus_through_tf_config(gpu_kernel):
    kernel = gpu_kernel()
    kernel.run("import os, tensorflow as tf\n%load_ext nbdist\nimport nbdist").check()
    assert kernel.value("nbdist.host.gpus._kernel") == "tf.config"
    assert kernel.value("os.environ['CUDA_VISIBLE_DEVICES']") == "0,1"  # too late for the environment
    assert kernel.value("tf.config.get_visible_devices('GPU')") == []
    reply = kernel.run("%dist status --kernel-gpu")
    assert reply.ename == "UsageError" and "--kernel-gpu does not apply to %dist status" in reply.evalue


@pytest.mark.cluster  # starts processes
def test_the_first_placement_stays_on_an_engine():
    code = ("from nbdist.host import gpus\n"
            "first = gpus.pin(1, 3)\n"
            "assert gpus.pin(0, 2) == first and gpus.pinned()['gpu'] == '1*', gpus.pinned()\n"
            "import os; assert os.environ['CUDA_VISIBLE_DEVICES'] == '1'\n")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "NBDIST_GPUS": "0,1"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

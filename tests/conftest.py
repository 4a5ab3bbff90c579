"""Test environment and shared fixtures: the local Hub server and a tiny real benchmark suite.

The environment block below runs at import time, before any test module imports
transformers/datasets/peft/huggingface_hub, because huggingface_hub reads
``HF_ENDPOINT``, ``HF_HUB_DISABLE_XET`` and ``HF_HUB_OFFLINE`` into constants when it is
first imported. Subprocesses (``accelerate launch``) inherit it through ``os.environ``.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HUB_PORT = _free_port()
HUB_ENDPOINT = f"http://127.0.0.1:{HUB_PORT}"
_HF_TMP = tempfile.mkdtemp(prefix="hf_clroute_tests_hf_")
os.environ.update(
    HF_ENDPOINT=HUB_ENDPOINT,
    HF_HUB_DISABLE_XET="1",  # else uploads go to a Xet CAS endpoint the local server lacks
    HF_DATASETS_OFFLINE="1",
    HF_HUB_DISABLE_TELEMETRY="1",
    HF_TOKEN="hf_clroute-dummy-token",  # the local Hub accepts any bearer token
    HF_HUB_OFFLINE="0",  # "1" would block the local round trip; nothing else is reachable anyway
    HF_HOME=os.path.join(_HF_TMP, "hf_home"),  # downloads never touch the user's cache
    HF_HUB_CACHE=os.path.join(_HF_TMP, "hf_home", "hub"),
)
os.environ.pop("TRANSFORMERS_OFFLINE", None)  # huggingface_hub treats it as HF_HUB_OFFLINE
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Under pytest-xdist (`-n 2`) each worker is one of the cores: one intra-op thread each, so two workers
    # do not oversubscribe the machine (torch reads this when it is first imported; subprocesses inherit it).
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    if "torch" in sys.modules:  # imported already (a plugin?): the variables came too late
        sys.modules["torch"].set_num_threads(1)

if "huggingface_hub" in sys.modules:  # imported before us (a plugin?): its constants are stale
    from huggingface_hub import constants as _hf_constants

    if _hf_constants.ENDPOINT != HUB_ENDPOINT:
        raise RuntimeError(
            "huggingface_hub was imported before tests/conftest.py could point HF_ENDPOINT at the local Hub "
            f"({_hf_constants.ENDPOINT!r} != {HUB_ENDPOINT!r}); do not import it from a pytest plugin."
        )

import pytest  # noqa: E402

if TYPE_CHECKING:
    from hf_clroute.testing import HubServer


@pytest.fixture(scope="session")
def hub_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    """The local Hub at ``HF_ENDPOINT`` (``hub_server.url``), file-backed in a session tmp dir."""
    from hf_clroute.testing import HubServer  # lazy: the package imports heavy modules

    server = HubServer(tmp_path_factory.mktemp("hub"), port=HUB_PORT).start()
    yield server
    server.stop()
    # The client swallows errors on some calls (e.g. best-effort registries), so a new
    # endpoint could go unnoticed; surface every request no route matched.
    if server.unrouted:
        pytest.fail(f"the local Hub got requests it does not implement: {server.unrouted}", pytrace=False)


@pytest.fixture
def hub_repo_id(request: pytest.FixtureRequest) -> str:
    """A fresh ``tester/<test name>-<random>`` repo id, so tests sharing the session Hub never collide."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60].strip("-")
    return f"tester/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def hub_down_endpoint(hub_server: HubServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``HF_ENDPOINT`` with the Hub stopped (connection refused); restarted, same data, afterwards.

    huggingface_hub retries connection errors with 1+2+4+8+8 s sleeps in ``http_backoff``;
    shrink those waits so "push while the Hub is down" tests fail fast instead of in ~23 s.
    """
    from huggingface_hub.utils import _http

    for fn in (_http.http_backoff, _http.http_stream_backoff):
        kwdefaults = getattr(fn, "__kwdefaults__", None) or {}
        if {"base_wait_time", "max_wait_time"} <= kwdefaults.keys():
            monkeypatch.setitem(kwdefaults, "base_wait_time", 0.01)
            monkeypatch.setitem(kwdefaults, "max_wait_time", 0.02)
    hub_server.stop()
    try:
        yield hub_server.url
    finally:
        hub_server.start()


@pytest.fixture(scope="session")
def tiny_suite(tmp_path_factory: pytest.TempPathFactory):
    """A suite file over real MNIST (4 classes, 2 tasks, a few examples) on a tiny ViT."""
    import json

    import torch
    from transformers import ViTImageProcessor, ViTModel

    from hf_clroute.backbones.catalog import tiny_vit_config

    root = tmp_path_factory.mktemp("suite")
    torch.manual_seed(0)
    ViTModel(tiny_vit_config()).save_pretrained(root / "vit")
    processor = ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    processor.save_pretrained(root / "vit")
    suite = {
        "name": "tiny-mnist",
        "dataset": "mnist",
        "backbone": str(root / "vit"),
        "n_tasks": 2,
        "max_classes": 4,
        "train_per_class": 16,
        "test_per_class": 8,
        "training": {"batch_size": 8, "eval_every": 2, "learning_rate": 0.001},
        "methods": ["finetune", "ncm"],
        "quick": {"train_per_class": 8},
    }
    path = root / "tiny.json"
    path.write_text(json.dumps(suite))
    return path


# Several run configs trained in turn by one process, each exactly as training/train_continual.py trains it:
# the interpreter's and `accelerate launch`'s start-up (seconds of imports a process) is paid once a group.
_TRAIN_GROUP = """
import argparse, sys
sys.path.insert(0, sys.argv[1])
from train_continual import load_run_config, training_function

for path in sys.argv[2:]:
    print("run config:", path, flush=True)
    training_function(load_run_config(path), argparse.Namespace(resume=False, stop_after_steps=0))
"""


@pytest.fixture(scope="session")
def train_group(tmp_path_factory: pytest.TempPathFactory):
    """``train(configs, processes)``: train each run config (a JSON file) in turn in one plain Python process
    (``processes=1``) or in one CPU ``accelerate launch --multi_gpu`` of ``processes`` processes."""
    import subprocess

    script = tmp_path_factory.mktemp("train-group") / "train_group.py"
    script.write_text(_TRAIN_GROUP)
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}

    def train(configs: list[Path], processes: int) -> None:
        command = [sys.executable]
        if processes > 1:
            command += ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
                        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                        "--main_process_port", str(_free_port())]  # a fresh one: back-to-back launches can collide
        command += [str(script), str(repo / "training"), *map(str, configs)]
        subprocess.run(command, check=True, env=env, cwd=repo)

    return train


@pytest.fixture
def checked_search_grid():
    """``check(method) -> grid``: the method's search grid has exactly the tuner's budget of distinct
    points, and each point resolves to a run that carries its values (split-mnist's settings)."""
    from hf_clroute.bench.harness.settings import resolve_run
    from hf_clroute.bench.harness.suites import SuiteConfig
    from hf_clroute.bench.runners.tune import BUDGET, search_grid, selected

    def check(method: str) -> list[dict]:
        grid = search_grid(method, trains=True)
        assert len(grid) == BUDGET and len({tuple(sorted(p.items())) for p in grid}) == BUDGET
        suite = SuiteConfig.load("split-mnist")
        config = resolve_run(suite, method, 0).adapter_config
        for point in grid:  # resolved as `hf-clroute tune` resolves it
            run = resolve_run(suite, method, 0, selected=selected(point, config))
            for key, value in point.items():  # "training.x", "config.x" or a nested "config.adaptation.x"
                section, *path = key.split(".")
                found = run.adapter_config if section == "config" else run.training
                for name in path:
                    found = found[name] if isinstance(found, dict) else getattr(found, name)
                assert found == value, key
        return grid

    return check


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny models (``pytestmark = pytest.mark.usefixtures("one_thread")``):
    on a shared 2-core machine their threads only fight each other."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

"""The fast paths change no number: decoded images, DataLoader workers, the evaluation cache."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from datasets import Dataset, Features, Image, Value
from torch.utils.data import DataLoader
from transformers import ViTImageProcessor, ViTModel

from hf_clroute import ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.backbones.catalog import tiny_vit_config
from hf_clroute.baselines import FinetuneConfig
from hf_clroute.data import ImageCollator, class_incremental, load_source
from hf_clroute.data.collate import decode_images, decode_stream
from hf_clroute.engine import make_accelerator
from hf_clroute.engine.batches import OrderedStream, training_loader
from hf_clroute.engine.evaluation import CollatedOnce, EvalCache
from hf_clroute.engine.trainer import release_prepared


@pytest.fixture(scope="module")
def stream():
    return class_incremental(
        load_source("mnist"), n_tasks=2, seed=0, classes=[0, 1, 2, 3], train_per_class=20, test_per_class=10,
        name="mnist",
    )


def _png_dataset(n: int = 6, size: int = 20, mode: str = "RGB") -> Dataset:
    """Colour (and palette) PNGs of an odd size, so the collator must convert and resize them."""
    import io

    from PIL import Image as PILImage

    rng = np.random.default_rng(0)
    images = []
    for i in range(n):
        pixels = rng.integers(0, 256, size=(size, size + i, 3), dtype=np.uint8)
        image = PILImage.fromarray(pixels).convert(mode)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        images.append({"bytes": buffer.getvalue(), "path": None})
    return Dataset.from_dict({"image": images, "label": list(range(n))},
                             features=Features({"image": Image(), "label": Value("int64")}))


COLLATORS = {
    "gray-28": lambda: ImageCollator(28, num_channels=1, mean=0.5, std=0.5),
    "rgb-16": lambda: ImageCollator(16, num_channels=3, mean=[0.5] * 3, std=[0.5] * 3),
    "vit-b16-224": lambda: ImageCollator.from_processor(
        ViTImageProcessor(size={"height": 224, "width": 224}, image_mean=[0.5] * 3, image_std=[0.5] * 3)),
}


def _reference(collator: ImageCollator, dataset) -> torch.Tensor:
    """The PNG path image by image, as the collator computed it before its batch fast path."""
    pixels = torch.stack([collator.to_tensor(ex[collator.image_column]) for ex in dataset])
    return (pixels - collator.mean) / collator.std


@pytest.mark.parametrize("name", sorted(COLLATORS))
def test_decoded_images_give_bit_identical_pixel_values(stream, name):
    collator = COLLATORS[name]()
    for png in (stream[0].test, _png_dataset(), _png_dataset(mode="P"), _png_dataset(mode="L")):
        decoded = decode_images(png, collator)
        assert decoded.num_rows == png.num_rows and decoded.column_names == png.column_names
        reference = _reference(collator, png)
        for examples in (list(png), list(decoded), list(decoded.with_format("torch")), list(decoded.with_format(None)),
                         png[:], decoded[:], decoded.with_format("torch")[:], decoded.with_format(None)[:]):
            pixels = collator(examples)["pixel_values"]
            assert pixels.dtype == torch.float32 and pixels.is_contiguous()
            assert torch.equal(pixels, reference)
        assert collator(list(decoded))["labels"].tolist() == list(png["label"])
        assert collator._ready_batch([ex["image"] for ex in decoded]) is not None  # no PIL, one step


def test_decode_stream_keeps_the_stream(stream):
    collator = COLLATORS["rgb-16"]()
    decoded = decode_stream(stream, collator)
    for before, after in zip(stream, decoded, strict=True):
        assert (after.task_id, after.classes, after.info) == (before.task_id, before.classes, before.info)
        assert list(after.train["label"]) == list(before.train["label"])
        assert torch.equal(collator(list(after.train))["pixel_values"], collator(list(before.train))["pixel_values"])


def test_torch_format_images_are_read_channels_first(stream):
    collator = COLLATORS["gray-28"]()
    png = stream[0].test
    assert torch.equal(collator(list(png.with_format("torch")))["pixel_values"], _reference(collator, png))


def _batches(loader) -> list[tuple[list, list]]:
    return [(b["pixel_values"].flatten(1).sum(1).tolist(), b["labels"].tolist()) for b in loader]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("epochs", [1, 2])
def test_ordered_stream_gives_the_same_batches_for_any_number_of_workers(stream, epochs):
    collator = COLLATORS["gray-28"]()
    data = stream[0].train_stream(epochs=epochs)  # 40 examples a pass: batches of 6 leave a short last one
    plain = _batches(DataLoader(data, batch_size=6, collate_fn=collator))
    assert len(plain) == -(-40 * epochs // 6)
    for workers in (0, 1, 2, 3):
        loader = DataLoader(OrderedStream(data, 6, chunk_size=16), batch_size=6, collate_fn=collator,
                            num_workers=workers)
        assert _batches(loader) == plain, workers
    for workers in (0, 2):  # the trainer's loader: batches as column slices
        config = TrainingConfig(batch_size=6, num_workers=workers, progress=False)
        assert _batches(training_loader(data, collator, config, Accelerator(cpu=True))) == plain, workers
        columns = DataLoader(OrderedStream(data, 6, chunk_size=16, columns=True), batch_size=None,
                             collate_fn=collator, num_workers=workers)
        assert _batches(columns) == plain, workers


def _fit(stream, **training):
    config = TrainingConfig(**{"batch_size": 8, "learning_rate": 1e-3, "progress": False, "eval_every": 2, **training})
    torch.manual_seed(0)
    model = get_cl_model(ViTModel(tiny_vit_config()), FinetuneConfig())
    cfg = tiny_vit_config()
    collator = ImageCollator(cfg.image_size, num_channels=cfg.num_channels)
    trainer = ContinualTrainer(model, stream, config, collator, make_accelerator(config, cpu=True))
    result = trainer.fit()
    weights = [p.detach().clone() for p in model.trainable_parameters()]
    return (result.accuracy_matrix, result.anytime, result.untrained_accuracy), weights, trainer


def test_workers_eval_cache_and_decoded_images_change_no_number(stream):
    reference, weights, trainer = _fit(stream, num_workers=0, eval_cache_examples=0)
    assert not any(isinstance(loader.dataset, CollatedOnce) for loader in trainer._test_loaders.values())
    cached, cached_weights, cached_trainer = _fit(stream, num_workers=0)
    assert all(isinstance(loader.dataset, CollatedOnce) and loader.dataset.batches
               for loader in cached_trainer._test_loaders.values())
    runs = [(cached, cached_weights), _fit(stream, num_workers=1, eval_cache_examples=0)[:2],
            _fit(stream, num_workers=2)[:2]]
    cfg = tiny_vit_config()
    runs.append(_fit(decode_stream(stream, ImageCollator(cfg.image_size, num_channels=cfg.num_channels)))[:2])
    for numbers, trained in runs:
        assert numbers == reference  # accuracy matrix, anytime accuracy, untrained accuracy: bit-identical
        assert all(torch.equal(a, b) for a, b in zip(trained, weights, strict=True))


def test_eval_cache_is_bounded(stream):
    collator = COLLATORS["gray-28"]()
    test = stream[0].test  # 20 examples
    assert not EvalCache(max_examples=19).admits(test) and EvalCache(max_examples=20).admits(test)
    assert not EvalCache(max_mb=0).admits(test)
    one_batch = 8 * 28 * 28 * 4 + 8 * 8  # pixel_values + labels of a batch of 8
    cache = EvalCache(max_mb=1.2 * one_batch / 2**20)
    dataset = CollatedOnce(test, collator, cache)
    loader = DataLoader(dataset, batch_size=8, collate_fn=lambda b: b)
    first, second = _batches(loader), _batches(loader)
    assert first == second == _batches(DataLoader(test, batch_size=8, collate_fn=collator))
    assert len(dataset.batches) == 1 and cache.bytes == one_batch <= cache.max_bytes


def test_task_end_drops_prepared_objects_without_a_full_collection(monkeypatch):
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer, _ = accelerator.prepare(model, optimizer, DataLoader(list(range(4)), batch_size=2))
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    assert optimizer.state and accelerator._optimizers
    collections = []
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(a) or 0)
    release_prepared(accelerator, optimizer)
    assert not collections
    assert not optimizer.state  # the moments are freed now, not at the next collection
    assert (accelerator._models, accelerator._optimizers, accelerator._dataloaders, accelerator.step) == ([], [], [], 0)


def test_dataloader_settings_are_validated_and_auto_workers_leave_a_core(monkeypatch):
    for bad in ({"num_workers": -2}, {"num_workers": 1.5}, {"prefetch_factor": 0}, {"pin_memory": "yes"},
                {"eval_cache_examples": -1}, {"eval_cache_mb": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            TrainingConfig(**bad)
    for cores, workers in ((1, 0), (2, 0), (3, 2), (4, 3), (16, 4)):
        monkeypatch.setattr("os.sched_getaffinity", lambda pid, n=cores: set(range(n)))
        assert TrainingConfig().workers == workers
    assert TrainingConfig(num_workers=3).workers == 3
    options = TrainingConfig(num_workers=2, prefetch_factor=4).loader_options(torch.device("cpu"))
    assert options["num_workers"] == 2 and options["prefetch_factor"] == 4 and options["pin_memory"] is False
    assert "prefetch_factor" not in TrainingConfig(num_workers=0).loader_options(torch.device("cpu"))


def test_small_image_streams_are_decoded_once_and_others_kept(stream):
    from hf_clroute.data.collate import decode_stream_if_small, decoded_size_mb

    collator = COLLATORS["gray-28"]()
    decoded = decode_stream_if_small(stream, collator)
    assert all(not isinstance(e.train.features["image"], Image) for e in decoded)
    decoded_pixels = collator(list(decoded[0].train))["pixel_values"]
    assert torch.equal(decoded_pixels, collator(list(stream[0].train))["pixel_values"])
    rows = sum(len(e.train) + len(e.test) for e in stream)
    assert decoded_size_mb(stream, collator) == pytest.approx(rows * 28 * 28 / 2**20)
    # Too large for the budget, text, or already decoded: the stream comes back as it was.
    assert all(a.train is b.train for a, b in zip(decode_stream_if_small(stream, collator, max_mb=0.01), stream))
    assert decode_stream_if_small(decoded, collator)[0].train is decoded[0].train
    assert decode_stream_if_small(stream, object())[0].train is stream[0].train


def test_the_loop_steps_the_torch_optimizer_only_where_accelerate_would_just_forward():
    from accelerate.optimizer import AcceleratedOptimizer

    from hf_clroute.engine.trainer import optimizer_to_step

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 2)
    inner = torch.optim.AdamW(model.parameters())
    _, prepared = accelerator.prepare(model, inner)
    assert isinstance(prepared, AcceleratedOptimizer) and optimizer_to_step(accelerator, prepared) is inner
    prepared.scaler = object()  # fp16 loss scaling: the wrapper must run
    assert optimizer_to_step(accelerator, prepared) is prepared
    prepared.scaler = None
    accelerator.gradient_accumulation_steps = 2  # accumulation: the wrapper skips steps that do not sync
    assert optimizer_to_step(accelerator, prepared) is prepared


def test_a_statistics_pass_keeps_the_model_mode_and_training_steps_run_in_train_mode(stream):
    """The trainer sets train mode once per task (and again after an anytime evaluation), not per
    step; a method with nothing to train reads its features in the mode the model is in."""
    from hf_clroute.baselines import NCMConfig

    cfg = tiny_vit_config()
    collator = ImageCollator(cfg.image_size, num_channels=cfg.num_channels)
    steps = sum(-(-len(e.train) // 8) for e in stream)
    for config, expected_train_calls in ((FinetuneConfig(), steps), (NCMConfig(), 0)):
        model = get_cl_model(ViTModel(tiny_vit_config()), config).eval()
        modes = []  # the backbone's mode at every forward call, training and evaluation
        model.backbone.register_forward_pre_hook(lambda module, args: modes.append(module.training))
        training = TrainingConfig(batch_size=8, progress=False, evals_per_task=3)
        ContinualTrainer(model, stream, training, collator, make_accelerator(training, cpu=True)).fit()
        assert modes.count(True) == expected_train_calls, config.method


def test_chunks_of_large_decoded_images_stay_small_and_give_the_same_batches(stream):
    from hf_clroute.engine.batches import fixed_row_bytes

    collator = COLLATORS["vit-b16-224"]()
    decoded = decode_images(_png_dataset(n=12), collator)  # 224x224x3 uint8 rows: 150,528 bytes each
    assert fixed_row_bytes(decoded.features) == 224 * 224 * 3 and fixed_row_bytes(_png_dataset().features) == 0
    data = decoded.to_iterable_dataset(num_shards=1)
    assert OrderedStream(data, batch_size=4).chunk_size == 24  # whole batches, ~4 MB, not 256 rows (38 MB)
    assert OrderedStream(data, batch_size=32).chunk_size == 32  # never under a batch
    assert OrderedStream(data, batch_size=5, chunk_size=12).chunk_size == 10
    gray = decode_images(stream[0].train, COLLATORS["gray-28"]()).to_iterable_dataset(num_shards=1)
    assert OrderedStream(gray, batch_size=4).chunk_size == 256
    config = TrainingConfig(batch_size=4, num_workers=0, progress=False)
    small = _batches(DataLoader(OrderedStream(data, 4, chunk_bytes=1), batch_size=4, collate_fn=collator))
    assert small == _batches(training_loader(data, collator, config, Accelerator(cpu=True)))


def test_ordered_stream_cuts_whole_batches_across_uneven_chunks(stream):
    """A source whose chunks do not end on batch boundaries still gives batches of batch_size rows."""
    class Uneven:
        def iter(self, batch_size):
            start = 0
            for size in (5, 7, 3, 2):
                yield {"x": np.arange(start, start + size), "y": list(range(start, start + size))}
                start += size

    reader = OrderedStream(stream[0].train_stream(epochs=1), batch_size=4)
    batches = list(reader._batches(Uneven()))
    assert [b["x"].tolist() for b in batches] == [list(range(i, min(i + 4, 17))) for i in range(0, 17, 4)]
    assert [b["y"] for b in batches] == [b["x"].tolist() for b in batches]


def test_collators_take_columns_with_the_same_result(stream):
    collator = COLLATORS["gray-28"]()
    decoded = decode_images(stream[0].test, collator)
    rows = list(decoded)
    for batch in (collator(rows), collator(decoded[:]), collator(stream[0].test[:])):
        assert torch.equal(batch["pixel_values"], collator(list(stream[0].test))["pixel_values"])
        assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [r["label"] for r in rows]


def test_probes_read_the_boundary_rows_test_features_with_the_same_numbers(stream):
    """The forgetting probe scores the test features the task-end row computed: the same records as
    running the model over every test split again, with fewer forward passes."""
    from hf_clroute.bench.harness.probes import ForgettingProbes

    cfg = tiny_vit_config()
    collator = ImageCollator(cfg.image_size, num_channels=cfg.num_channels)
    runs = {}
    for reuse in (True, False):
        torch.manual_seed(0)
        model = get_cl_model(ViTModel(tiny_vit_config()), FinetuneConfig(head_init_seed=0))
        calls = []
        model.backbone.register_forward_pre_hook(lambda module, args: calls.append(1))
        training = TrainingConfig(batch_size=8, progress=False, eval_batch_size=256)
        trainer = ContinualTrainer(model, stream, training, collator, make_accelerator(training, cpu=True),
                                   callbacks=[ForgettingProbes()])
        if not reuse:
            trainer.test_features = lambda task_id: None
        result = trainer.fit()
        runs[reuse] = (result.accuracy_matrix, result.records["probes"], len(calls))
        if reuse:  # the last row kept both tasks' test features, in the split's order
            features, labels = trainer.test_features(1)
            assert labels.tolist() == list(stream[1].test["label"]) and features.shape[0] == len(stream[1].test)
    assert runs[True][:2] == runs[False][:2]
    # three probe passes over a test split (tasks 0; 0 and 1) are read off the rows instead
    assert runs[False][2] - runs[True][2] == 3


def test_a_frozen_backbones_test_features_are_computed_once_with_the_same_scores(stream):
    """A frozen-backbone head is scored on test features kept from its first evaluation: the
    same accuracy matrix as running the backbone at every evaluation, and each test batch goes
    through the backbone once."""
    cfg = tiny_vit_config()
    collator = ImageCollator(cfg.image_size, num_channels=cfg.num_channels)
    runs = {}
    for cache in (20_000, 0):
        torch.manual_seed(0)
        model = get_cl_model(ViTModel(cfg), FinetuneConfig(freeze_backbone=True, head_init_seed=0))
        assert model.reads_frozen_features()
        calls = []  # the backbone's mode at every forward (a global hook: one on the backbone would end the caching)
        hook = torch.nn.modules.module.register_module_forward_pre_hook(
            lambda module, args, _calls=calls: _calls.append(module.training) if isinstance(module, ViTModel) else None)
        training = TrainingConfig(batch_size=8, progress=False, evals_per_task=3, eval_cache_examples=cache)
        try:
            result = ContinualTrainer(model, stream, training, collator, make_accelerator(training, cpu=True)).fit()
        finally:
            hook.remove()
        runs[cache] = (result.accuracy_matrix, result.anytime, result.untrained_accuracy, calls.count(False))
    assert runs[20_000][:3] == runs[0][:3]
    assert runs[20_000][3] == len(stream)  # one batch per test split (20 examples), read once
    assert runs[0][3] > 3 * len(stream)
    # a trained backbone's features change: none are kept
    assert not get_cl_model(ViTModel(cfg), FinetuneConfig()).reads_frozen_features()


def test_cached_features_follow_the_features_precision_and_stay_float32(stream, monkeypatch):
    """The bench's feature cache encodes under the ``features`` phase's autocast, stores float32 and says
    what it chose; fp32 (the default for an unmeasured backbone) gives the features of a plain forward."""
    from hf_clroute.backbones.precision import ENV_VAR
    from hf_clroute.bench.harness.feature_cache import cache_stream_features

    cfg = tiny_vit_config()
    collator = ImageCollator(cfg.image_size, num_channels=cfg.num_channels)
    torch.manual_seed(0)
    backbone = ViTModel(cfg)
    monkeypatch.delenv(ENV_VAR, raising=False)
    cached = {}
    for setting in ("fp32", "bf16", None):
        experiences, _ = cache_stream_features(backbone, stream[:1], collator, precision=setting)
        cached[setting] = torch.from_numpy(np.asarray(experiences[0].test[:]["features"]))
        assert cached[setting].dtype == torch.float32
        assert experiences[0].info["feature_precision"]["dtype"] == ("bf16" if setting == "bf16" else "fp32")
    assert torch.equal(cached["fp32"], cached[None])  # auto: the tiny ViT was never measured faster in bf16
    assert not torch.equal(cached["fp32"], cached["bf16"])
    assert torch.allclose(cached["fp32"], cached["bf16"], atol=0.1, rtol=0.05)


def test_probes_keep_fixed_training_features_with_the_same_records(stream):
    """While the features cannot change (a frozen backbone), the forgetting probe reads each task's
    training and test features from the task end that computed them: the same records as recomputing them
    at every task end, one pass fewer over task 0's splits on a 2-task stream. A backbone
    that trained since its features were kept is read afresh."""
    from hf_clroute.bench.harness.probes import PROBE_BATCH_SIZE, ForgettingProbes

    cfg = tiny_vit_config()
    collator = ImageCollator(cfg.image_size, num_channels=cfg.num_channels)
    runs = {}
    for keep in (True, False):
        torch.manual_seed(0)
        model = get_cl_model(ViTModel(cfg), FinetuneConfig(freeze_backbone=True, head_init_seed=0))
        calls = []
        hook = torch.nn.modules.module.register_module_forward_pre_hook(
            lambda module, args, _calls=calls: _calls.append(1) if isinstance(module, ViTModel) else None)
        # wordnet's evaluation batches (128) are not the probe's (256): the probe computes test features too
        training = TrainingConfig(batch_size=8, progress=False, eval_batch_size=128)
        try:
            result = ContinualTrainer(model, stream, training, collator, make_accelerator(training, cpu=True),
                                      callbacks=[ForgettingProbes(keep_features=keep)]).fit()
        finally:
            hook.remove()
        runs[keep] = (result.accuracy_matrix, result.records["probes"], len(calls))
    assert runs[True][:2] == runs[False][:2]
    # task 1's end reads task 0's training and test features (one batch each) from task 0's end
    assert runs[False][2] - runs[True][2] == -(-len(stream[0].train) // PROBE_BATCH_SIZE) + 1

    # the same callback on a backbone whose weights moved between task ends computes them again
    torch.manual_seed(0)
    model = get_cl_model(ViTModel(cfg), FinetuneConfig(freeze_backbone=True, head_init_seed=0))
    training = TrainingConfig(batch_size=8, progress=False)
    trainer = ContinualTrainer(model, stream, training, collator, make_accelerator(training, cpu=True))
    probes = ForgettingProbes()
    trainer.result.records = {}
    probes.on_task_end(trainer, 0)
    kept = probes._kept["train", 0][0].clone()
    with torch.no_grad():
        next(model.backbone.parameters()).add_(1.0)
    probes.on_task_end(trainer, 1)
    assert not torch.equal(probes._kept["train", 0][0], kept)

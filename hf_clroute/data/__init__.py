"""Data: offline source recipes, dataset loading/validation, continual streams, collators."""

from hf_clroute.data.class_tasks import class_incremental, classes_with_at_least
from hf_clroute.data.collate import (
    CausalLMCollator,
    ImageCollator,
    TextClassificationCollator,
)
from hf_clroute.data.domain_tasks import domain_incremental, permuted, text_domains
from hf_clroute.data.experiences import Experience, validation_stream
from hf_clroute.data.labeled import (
    column_array,
    infer_modality,
    load_labeled_dataset,
    load_text_corpus,
)
from hf_clroute.data.sources import (
    SOURCES,
    Source,
    cache_dir,
    load_source,
    prepare_all,
    prepare_source,
)
from hf_clroute.data.streaming import class_incremental_streaming, parquet_stream

__all__ = [
    "SOURCES",
    "CausalLMCollator",
    "Experience",
    "ImageCollator",
    "Source",
    "TextClassificationCollator",
    "cache_dir",
    "class_incremental",
    "class_incremental_streaming",
    "classes_with_at_least",
    "column_array",
    "domain_incremental",
    "infer_modality",
    "load_labeled_dataset",
    "load_source",
    "load_text_corpus",
    "parquet_stream",
    "permuted",
    "prepare_all",
    "prepare_source",
    "text_domains",
    "validation_stream",
]

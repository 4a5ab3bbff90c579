"""Data: offline source recipes, dataset loading/validation, continual streams, collators."""

from .collate import CausalLMCollator, ImageCollator, TextClassificationCollator
from .loading import column_array, infer_modality, load_labeled_dataset, load_text_corpus
from .sources import SOURCES, Source, cache_dir, load_source, prepare_all, prepare_source
from .streaming import class_incremental_streaming, parquet_stream
from .streams import (
    Experience,
    class_incremental,
    classes_with_at_least,
    domain_incremental,
    permuted,
    text_domains,
    validation_stream,
)

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

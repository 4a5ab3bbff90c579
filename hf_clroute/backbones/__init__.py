"""Backbones: the catalog of supported models, the char tokenizer, precision, the committed assets."""

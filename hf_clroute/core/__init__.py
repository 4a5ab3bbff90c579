"""The adapter model: configs, the registry, the method interface, CLModel, labels, model cards, AutoCLModel."""

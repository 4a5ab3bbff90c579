"""The user commands behind `hf-clroute train`, `evaluate` and `push`."""

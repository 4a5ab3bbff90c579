"""The runners a suite names (classification, char-LM, plasticity) and `hf-clroute tune`."""

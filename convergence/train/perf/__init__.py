"""A training step's speed, measured in one process: ``step`` (the one step every measurement here times: model,
recipe, optimizer, optionally compiled) and ``bench`` (step time of BF16 and MXFP8 per kernel, each configuration
repeated; ``python -m convergence bench``)."""

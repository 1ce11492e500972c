"""A training step's speed, measured in one process: ``step`` (the one step every measurement here times: model,
recipe, optimizer, optionally compiled), ``bench`` (step time of BF16 and MXFP8 per kernel, each configuration
repeated; ``python -m convergence bench``), ``trace`` (a torch.profiler trace read as GPU kernel time, idle gaps,
launches, synchronisations and time per kind of work) and ``profile_step`` (``python -m convergence
profile-step``: one configuration's steps profiled and read by ``trace``)."""

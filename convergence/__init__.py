"""Training level of mxval: model, recipes, data, paired runs, loss-curve loading and comparison."""

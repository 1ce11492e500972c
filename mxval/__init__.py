"""The ``mxval`` console command: one entry point over the packages' command lines."""

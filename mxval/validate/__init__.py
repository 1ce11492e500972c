"""``mxval validate``: every level this machine can run, one report.

Modules: ``ladder`` (what runs at which size), ``levels`` (one function per rung), ``run`` (the driver and
its CLI), ``report`` (report.md / report.html / summary.json), ``figures``.
"""

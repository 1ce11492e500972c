"""Versioned reference artifacts: golden/<level>/<name>__<hardware>.<ext> with a .meta.json sidecar."""

"""Single-host composition root: the foreground run and (feature ``daemon``) the daemon."""
